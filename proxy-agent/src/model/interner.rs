//! Values that many model entries hold equal (namespaces, port names,
//! endpoint placements), allocated once and shared. An interner forgets
//! the values nobody holds any more when it has doubled since its last
//! sweep, so names of deleted namespaces or nodes do not pile up.

use std::{
    hash::Hash,
    sync::{Arc, LazyLock, Mutex},
};

pub struct Interner<T: ?Sized + 'static>(LazyLock<Mutex<Shared<T>>>);

struct Shared<T: ?Sized> {
    values: foldhash::HashSet<Arc<T>>,
    swept_at: usize,
}

impl<T: ?Sized> Default for Shared<T> {
    fn default() -> Self {
        Shared {
            values: Default::default(),
            swept_at: 0,
        }
    }
}

impl<T: ?Sized + Hash + Eq> Interner<T> {
    pub const fn new() -> Self {
        Interner(LazyLock::new(Default::default))
    }

    /// The shared `Arc` equal to `value`, if there is one.
    pub fn find(&self, value: &T) -> Option<Arc<T>> {
        let shared = self.0.lock().unwrap_or_else(|e| e.into_inner());
        shared.values.get(value).cloned()
    }

    /// The shared `Arc` equal to `value`: the one already known, else `value`.
    pub fn share(&self, value: Arc<T>) -> Arc<T> {
        let mut shared = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = shared.values.get(&*value) {
            return known.clone();
        }
        if shared.values.len() >= 2 * shared.swept_at + 64 {
            shared.values.retain(|v| Arc::strong_count(v) > 1);
            shared.swept_at = shared.values.len();
        }
        shared.values.insert(value.clone());
        value
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.0.lock().unwrap().values.len()
    }
}

/// Namespaces and port names: few distinct ones, held by every service key.
static STRINGS: Interner<str> = Interner::new();

pub fn shared_str(s: impl Into<Arc<str>>) -> Arc<str> {
    STRINGS.share(s.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_allocation_and_unheld_ones_are_swept() {
        let interner: Interner<str> = Interner::new();
        let a = interner.share("a".into());
        let b = interner.share("a".into());
        assert!(Arc::ptr_eq(&a, &b));
        assert!(Arc::ptr_eq(&a, &interner.find("a").unwrap()));
        assert!(!Arc::ptr_eq(&a, &interner.share("b".into())));
        for i in 0..1000 {
            drop(interner.share(format!("gone-{i}").into()));
        }
        assert!(interner.len() < 70, "{} kept", interner.len());
        assert!(Arc::ptr_eq(&a, &interner.share("a".into())));
    }
}
