//! A set kept as a sorted Vec, for the per-service sets of frontends: a
//! service has a handful, and a `BTreeSet` allocates a node of eleven keys
//! for the first (14 MB of the agent's heap at 50,000 services).

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SmallSet<T>(Vec<T>);

impl<T> Default for SmallSet<T> {
    fn default() -> Self {
        SmallSet(Vec::new())
    }
}

impl<T: Ord> SmallSet<T> {
    /// Adds `item`; false when it was already there.
    pub fn insert(&mut self, item: T) -> bool {
        match self.0.binary_search(&item) {
            Ok(_) => false,
            Err(i) => {
                self.0.reserve_exact(1);
                self.0.insert(i, item);
                true
            }
        }
    }

    /// Removes `item`; false when it was not there.
    pub fn remove(&mut self, item: &T) -> bool {
        match self.0.binary_search(item) {
            Ok(i) => {
                self.0.remove(i);
                true
            }
            Err(_) => false,
        }
    }

    pub fn contains(&self, item: &T) -> bool {
        self.0.binary_search(item).is_ok()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'a, T> IntoIterator for &'a SmallSet<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::SmallSet;

    #[test]
    fn keeps_items_sorted_and_unique() {
        let mut set = SmallSet::default();
        assert!(set.insert(3));
        assert!(set.insert(1));
        assert!(!set.insert(3));
        assert!(set.insert(2));
        assert_eq!(set.iter().copied().collect::<Vec<_>>(), [1, 2, 3]);
        assert!(set.remove(&2));
        assert!(!set.remove(&2));
        assert!(set.contains(&1) && !set.contains(&2));
        assert_eq!(set.len(), 2);
    }
}
