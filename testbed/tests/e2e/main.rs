//! The testbed itself, in one binary: a testbed and a two-node cluster
//! leave nothing behind (on drop, panic and signals), and who reaches whom,
//! what the lan carries and how XDP_TX frames travel. Needs root (it creates
//! network namespaces).

mod cleanup;
mod cluster;

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use testbed::netns;

/// Runs `testbed-hold ARGS`, which builds a testbed of `count` namespaces,
/// prints their names and holds it; sends it `signal`, and checks that it
/// exits with 128 + `signal` and that none of the namespaces is left.
fn signal_removes_every_namespace(args: &[&str], count: usize, signal: i32) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_testbed-hold"))
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let names: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
    assert_eq!(names.len(), count, "{line}");
    assert!(names.iter().all(|n| netns::exists(n)));
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, signal) };
    assert_eq!(child.wait().unwrap().code(), Some(128 + signal));
    let deadline = Instant::now() + Duration::from_secs(5);
    while names.iter().any(|n| netns::exists(n)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<_> = names.iter().filter(|n| netns::exists(n)).collect();
    assert!(
        left.is_empty(),
        "left behind after signal {signal}: {left:?}"
    );
}
