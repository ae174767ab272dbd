/// Hands out small integer ids, reusing released ones; 0 is never used so a
/// zeroed map value never names anything.
#[derive(Debug)]
pub(super) struct Ids {
    first: u32,
    next: u32,
    max: u32,
    free: Vec<u32>,
}

impl Ids {
    /// Ids from `first` to `max`, both included (`first` > 0).
    pub(super) fn range(first: u32, max: u32) -> Self {
        Self {
            first: first.max(1),
            next: first.max(1),
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

    pub(super) fn has_free(&self) -> bool {
        !self.free.is_empty() || self.next <= self.max
    }
}

impl Ids {
    /// Takes over ids already in use (read back from the maps): new ids are
    /// the gaps below the highest, then above it.
    pub(super) fn adopt(&mut self, used: impl IntoIterator<Item = u32>) {
        let used: std::collections::BTreeSet<u32> = used
            .into_iter()
            .filter(|id| (self.first..=self.max).contains(id))
            .collect();
        let Some(highest) = used.last().copied() else {
            return;
        };
        self.next = self.next.max(highest.saturating_add(1));
        self.free = (self.first..self.next)
            .rev()
            .filter(|id| !used.contains(id) && !self.free.contains(id))
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::Ids;

    #[test]
    fn adopted_ids_are_never_handed_out_again() {
        let mut ids = Ids::range(1, 100);
        ids.adopt([2, 5, 3]);
        let taken: Vec<u32> = (0..4).filter_map(|_| ids.take()).collect();
        assert_eq!(taken, vec![1, 4, 6, 7]);
    }
}
