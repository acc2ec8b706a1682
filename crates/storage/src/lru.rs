//! A least-recently-used set that bounds how many logs hold open files.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// Tracks which logs were used most recently. A shard calls [`touch`](Self::touch) on
/// every use of a log; when more than `capacity` logs are tracked, it returns the least
/// recently used one, whose files the shard then lets go (the node closes that
/// partition's log and journal whole). Each log holds at most two open files, so a
/// shard's logs hold fewer than `2 * capacity`.
#[derive(Debug)]
pub struct OpenLogLru<K> {
    capacity: usize,
    clock: u64,
    stamps: HashMap<K, u64>,
    order: BTreeMap<u64, K>,
}

impl<K: Hash + Eq + Clone> OpenLogLru<K> {
    /// How many logs it keeps open at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// An empty set that keeps at most `capacity` logs open (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            clock: 0,
            stamps: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    /// Marks `key` as just used; returns the log to release, if the set overflowed.
    #[must_use = "the returned log must release its files"]
    pub fn touch(&mut self, key: &K) -> Option<K> {
        self.clock += 1;
        if let Some(old) = self.stamps.insert(key.clone(), self.clock) {
            self.order.remove(&old);
        }
        self.order.insert(self.clock, key.clone());
        if self.stamps.len() <= self.capacity {
            return None;
        }
        let (_, evicted) = self.order.pop_first()?;
        self.stamps.remove(&evicted);
        Some(evicted)
    }

    /// Stops tracking `key` (the log was closed or deleted).
    pub fn remove(&mut self, key: &K) {
        if let Some(stamp) = self.stamps.remove(key) {
            self.order.remove(&stamp);
        }
    }

    /// Whether `key` is tracked (used since it was last evicted or removed).
    pub fn contains(&self, key: &K) -> bool {
        self.stamps.contains_key(key)
    }

    /// Logs tracked.
    pub fn len(&self) -> usize {
        self.stamps.len()
    }

    /// Whether none is tracked.
    pub fn is_empty(&self) -> bool {
        self.stamps.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used() {
        let mut lru = OpenLogLru::new(2);
        assert_eq!(lru.touch(&1), None);
        assert_eq!(lru.touch(&2), None);
        assert_eq!(lru.touch(&1), None);
        assert_eq!(lru.touch(&3), Some(2));
        assert_eq!(lru.touch(&4), Some(1));
        assert!(lru.contains(&3) && !lru.contains(&2));
        lru.remove(&3);
        assert_eq!(lru.len(), 1);
        assert_eq!(lru.touch(&5), None);
    }
}
