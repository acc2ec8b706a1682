//! A value kept out of line, and only while it differs from its idle form: a node holds
//! thousands of idle groups, and each would otherwise pay the empty header of every
//! collection its replica uses only while busy (a `BTreeMap` is 24 bytes empty, a
//! pointer 8).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::{Deref, DerefMut};

/// A type with an idle form that every idle holder reads, shared.
pub(crate) trait Idle: Default + PartialEq + 'static {
    /// The idle form.
    fn idle() -> &'static Self;
}

/// `T`, boxed while it differs from [`Idle::idle`]. Reads of an idle one see the shared
/// idle form; the first write boxes a copy; [`Lazy::settle`] drops a box that went
/// idle again.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Lazy<T: Idle>(Option<Box<T>>);

impl<T: Idle> Lazy<T> {
    /// Drops the box if what it holds is idle again.
    pub(crate) fn settle(&mut self) {
        if self.0.as_deref().is_some_and(|value| value == T::idle()) {
            self.0 = None;
        }
    }

    /// Changes the value only if it is boxed: for changes that only take away, which an
    /// idle value needs none of (no box is made for them).
    pub(crate) fn if_boxed(&mut self, change: impl FnOnce(&mut T)) {
        if let Some(value) = self.0.as_deref_mut() {
            change(value);
        }
    }

    /// Whether a box is held (for tests of what an idle group keeps).
    #[cfg(test)]
    pub(crate) fn is_boxed(&self) -> bool {
        self.0.is_some()
    }
}

impl<T: Idle> From<T> for Lazy<T> {
    fn from(value: T) -> Self {
        let mut lazy = Self(Some(Box::new(value)));
        lazy.settle();
        lazy
    }
}

impl<T: Idle> Deref for Lazy<T> {
    type Target = T;

    fn deref(&self) -> &T {
        match self.0.as_deref() {
            Some(value) => value,
            None => T::idle(),
        }
    }
}

impl<T: Idle> DerefMut for Lazy<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0.get_or_insert_with(Box::default)
    }
}

impl<T: Idle + std::fmt::Debug> std::fmt::Debug for Lazy<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

/// Implements [`Idle`] for types whose idle form is a `const` empty value.
macro_rules! idle_as {
    ($($ty:ty => $empty:expr;)+) => {$(
        impl Idle for $ty {
            fn idle() -> &'static Self {
                static IDLE: $ty = $empty;
                &IDLE
            }
        }
    )+};
}

idle_as! {
    BTreeSet<u64> => BTreeSet::new();
    BTreeMap<u64, crate::Checksum> => BTreeMap::new();
    BTreeMap<u64, BTreeSet<crate::ReplicaId>> => BTreeMap::new();
    Vec<crate::Output> => Vec::new();
    crate::replica::IgnoredCounts => crate::replica::IgnoredCounts::NONE;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_see_the_idle_form_writes_box_and_settle_drops_an_idle_box() {
        let mut set: Lazy<BTreeSet<u64>> = Lazy::default();
        assert!(set.is_empty() && !set.contains(&3));
        assert!(!set.is_boxed(), "a read boxes nothing");
        set.insert(3);
        assert!(set.is_boxed() && set.contains(&3));
        set.settle();
        assert!(set.is_boxed(), "a box that holds something stays");
        set.remove(&3);
        set.settle();
        assert!(!set.is_boxed(), "an idle one goes");
        assert_eq!(std::mem::size_of::<Lazy<BTreeSet<u64>>>(), 8);
    }
}
