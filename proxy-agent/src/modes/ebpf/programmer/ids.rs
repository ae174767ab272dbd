/// Hands out small integer ids, reusing released ones; 0 is never used so a
/// zeroed map value never names anything.
#[derive(Debug)]
pub(super) struct Ids {
    next: u32,
    max: u32,
    free: Vec<u32>,
}

impl Ids {
    pub(super) fn new(max: u32) -> Self {
        Self {
            next: 1,
            max,
            free: Vec::new(),
        }
    }

    pub(super) fn take(&mut self) -> Option<u32> {
        self.free.pop().or_else(|| {
            (self.next <= self.max).then(|| {
                self.next += 1;
                self.next - 1
            })
        })
    }

    pub(super) fn give_back(&mut self, id: u32) {
        self.free.push(id);
    }
}
