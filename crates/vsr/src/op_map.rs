//! A small map keyed by `u64` (an op, a client), in a vector sorted by key: the
//! replica's journal in memory, the client table's sessions and registrations, and the
//! node's journal files' entries.
//!
//! A B-tree allocates a node with room for eleven entries for the first one, and an
//! idle group's journal holds one (the anchor its next prepare chains to): a heap
//! profile of 10,000 idle partitions found 350 bytes per group here, half of it the
//! node. Ops arrive mostly in order and a journal holds at most a checkpoint interval
//! and a pipeline of them, so a sorted vector costs no more to keep, and it gives its
//! room back when it empties.

use std::ops::{Bound, RangeBounds};

/// A map from op to `V`, ordered by op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpMap<V> {
    entries: Vec<(u64, V)>,
}

impl<V> Default for OpMap<V> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<V> OpMap<V> {
    /// An empty map (no allocation).
    pub fn new() -> Self {
        Self::default()
    }

    fn position(&self, op: u64) -> Result<usize, usize> {
        self.entries.binary_search_by_key(&op, |(o, _)| *o)
    }

    /// How many entries it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry at `op`.
    pub fn get(&self, op: &u64) -> Option<&V> {
        let at = self.position(*op).ok()?;
        self.entries.get(at).map(|(_, v)| v)
    }

    /// The entry at `op`, to change.
    pub fn get_mut(&mut self, op: &u64) -> Option<&mut V> {
        let at = self.position(*op).ok()?;
        self.entries.get_mut(at).map(|(_, v)| v)
    }

    /// Whether it holds an entry at `op`.
    pub fn contains_key(&self, op: &u64) -> bool {
        self.position(*op).is_ok()
    }

    /// Puts `value` at `op`, returning what was there.
    pub fn insert(&mut self, op: u64, value: V) -> Option<V> {
        match self.position(op) {
            Ok(at) => Some(std::mem::replace(&mut self.entries[at].1, value)),
            Err(at) => {
                self.reserve_first();
                self.entries.insert(at, (op, value));
                None
            }
        }
    }

    /// The entry at `op`, put there first if there is none.
    pub fn or_insert(&mut self, op: u64, value: V) -> &mut V {
        let at = match self.position(op) {
            Ok(at) => at,
            Err(at) => {
                self.reserve_first();
                self.entries.insert(at, (op, value));
                at
            }
        };
        &mut self.entries[at].1
    }

    /// Takes the entry at `op` out.
    pub fn remove(&mut self, op: &u64) -> Option<V> {
        let at = self.position(*op).ok()?;
        let (_, value) = self.entries.remove(at);
        self.give_back_room();
        Some(value)
    }

    /// Keeps only the entries `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(&u64, &mut V) -> bool) {
        self.entries.retain_mut(|(op, value)| keep(op, value));
        self.give_back_room();
    }

    /// Removes every entry and gives back the room.
    pub fn clear(&mut self) {
        self.entries = Vec::new();
    }

    /// Splits off the entries at or above `op`, which it returns.
    pub fn split_off(&mut self, op: &u64) -> Self {
        let at = self.entries.partition_point(|(o, _)| o < op);
        let above = Self {
            entries: self.entries.split_off(at),
        };
        self.give_back_room();
        above
    }

    /// The entries, in op order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&u64, &V)> {
        self.entries.iter().map(|(op, value)| (op, value))
    }

    /// The entries, in op order, to change.
    pub fn iter_mut(&mut self) -> impl DoubleEndedIterator<Item = (&u64, &mut V)> {
        self.entries.iter_mut().map(|(op, value)| (&*op, value))
    }

    /// The ops, in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &u64> {
        self.entries.iter().map(|(op, _)| op)
    }

    /// The entries' values, in op order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> {
        self.entries.iter().map(|(_, value)| value)
    }

    /// The entries whose op lies in `ops`, in order.
    pub fn range(&self, ops: impl RangeBounds<u64>) -> impl DoubleEndedIterator<Item = (&u64, &V)> {
        let start = match ops.start_bound() {
            Bound::Included(&op) => self.entries.partition_point(|(o, _)| *o < op),
            Bound::Excluded(&op) => self.entries.partition_point(|(o, _)| *o <= op),
            Bound::Unbounded => 0,
        };
        let end = match ops.end_bound() {
            Bound::Included(&op) => self.entries.partition_point(|(o, _)| *o <= op),
            Bound::Excluded(&op) => self.entries.partition_point(|(o, _)| *o < op),
            Bound::Unbounded => self.entries.len(),
        };
        self.entries[start..end.max(start)]
            .iter()
            .map(|(op, value)| (op, value))
    }

    /// Room for one entry in an empty journal (a vector's first growth takes four):
    /// an idle group holds one.
    fn reserve_first(&mut self) {
        if self.entries.capacity() == 0 {
            self.entries.reserve_exact(1);
        }
    }

    /// Frees the room of a journal that shrank to a fraction of it (an idle group's
    /// keeps one entry; a busy one's stays put between checkpoints).
    fn give_back_room(&mut self) {
        if self.entries.capacity() > 4 * self.entries.len().max(2) {
            self.entries.shrink_to_fit();
        }
    }
}

impl<V> FromIterator<(u64, V)> for OpMap<V> {
    /// The map of `pairs`; a later pair for the same op replaces an earlier one.
    fn from_iter<I: IntoIterator<Item = (u64, V)>>(pairs: I) -> Self {
        let mut map = Self::new();
        for (op, value) in pairs {
            map.insert(op, value);
        }
        map
    }
}

impl<'a, V> IntoIterator for &'a OpMap<V> {
    type Item = (&'a u64, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (u64, V)>, fn(&'a (u64, V)) -> Self::Item>;

    fn into_iter(self) -> Self::IntoIter {
        fn pair<V>((op, value): &(u64, V)) -> (&u64, &V) {
            (op, value)
        }
        self.entries
            .iter()
            .map(pair as fn(&'a (u64, V)) -> Self::Item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone)]
    enum Step {
        Insert(u64, u32),
        OrInsert(u64, u32),
        Remove(u64),
        Retain(u64),
        SplitOff(u64),
        Clear,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (0..64u64, any::<u32>()).prop_map(|(o, v)| Step::Insert(o, v)),
            1 => (0..64u64, any::<u32>()).prop_map(|(o, v)| Step::OrInsert(o, v)),
            2 => (0..64u64).prop_map(Step::Remove),
            1 => (0..64u64).prop_map(Step::Retain),
            1 => (0..64u64).prop_map(Step::SplitOff),
            1 => Just(Step::Clear),
        ]
    }

    proptest! {
        /// Every operation leaves the same entries, in the same order, as a B-tree
        /// given the same operations (what the replica used before).
        #[test]
        fn it_behaves_as_an_ordered_map(steps in prop::collection::vec(step(), 0..200), from in 0..70u64, to in 0..70u64) {
            let mut map = OpMap::new();
            let mut model = BTreeMap::new();
            for step in steps {
                match step {
                    Step::Insert(op, v) => prop_assert_eq!(map.insert(op, v), model.insert(op, v)),
                    Step::OrInsert(op, v) => {
                        prop_assert_eq!(*map.or_insert(op, v), *model.entry(op).or_insert(v));
                    }
                    Step::Remove(op) => prop_assert_eq!(map.remove(&op), model.remove(&op)),
                    Step::Retain(below) => {
                        map.retain(|op, _| *op < below);
                        model.retain(|op, _| *op < below);
                    }
                    Step::SplitOff(op) => {
                        let above: Vec<_> = map.split_off(&op).iter().map(|(o, v)| (*o, *v)).collect();
                        let expected: Vec<_> = model.split_off(&op).into_iter().collect();
                        prop_assert_eq!(above, expected);
                    }
                    Step::Clear => {
                        map.clear();
                        model.clear();
                    }
                }
                let held: Vec<_> = map.iter().map(|(o, v)| (*o, *v)).collect();
                let expected: Vec<_> = model.iter().map(|(o, v)| (*o, *v)).collect();
                prop_assert_eq!(&held, &expected);
                prop_assert_eq!(map.len(), model.len());
            }
            let (low, high) = (from.min(to), from.max(to));
            let ranges: Vec<Vec<u64>> = vec![
                map.range(low..).map(|(o, _)| *o).collect(),
                map.range(..=high).map(|(o, _)| *o).collect(),
                map.range(low..high).map(|(o, _)| *o).collect(),
                map.range(low..=high).rev().map(|(o, _)| *o).collect(),
            ];
            let expected: Vec<Vec<u64>> = vec![
                model.range(low..).map(|(o, _)| *o).collect(),
                model.range(..=high).map(|(o, _)| *o).collect(),
                model.range(low..high).map(|(o, _)| *o).collect(),
                model.range(low..=high).rev().map(|(o, _)| *o).collect(),
            ];
            prop_assert_eq!(ranges, expected);
            prop_assert_eq!(map.keys().next_back(), model.keys().next_back());
        }
    }

    #[test]
    fn a_journal_that_empties_gives_its_room_back() {
        let mut map = OpMap::new();
        for op in 0..100u64 {
            map.insert(op, op);
        }
        map.retain(|op, _| *op == 99);
        assert_eq!(map.len(), 1);
        assert!(map.entries.capacity() <= 8, "{}", map.entries.capacity());
    }
}
