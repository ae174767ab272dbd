mod model;

fn main() {}
