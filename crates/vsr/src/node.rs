//! Many groups on one node: inputs routed by group id, and a timer index so a tick
//! touches only the groups whose deadline has come. With `Config::quiesce`, an idle
//! group has no deadline at all (it is not in the index) and keeps only its commit
//! anchor in memory; a message wakes it (`tests/idle_memory.rs` runs 2,000 groups per
//! node to quiescence, measures their heap and wakes one). Groups are kept in `BTreeMap`s, so every walk
//! over them (ticks, heartbeats) runs in group order: a seed replays the same run.

use std::collections::{BTreeMap, BTreeSet};

use crate::message::Message;
use crate::replica::{Input, Output, Replica};
use crate::state::StateMachine;

/// The replicas one node holds, one per group.
#[derive(Debug)]
pub struct Node<S> {
    /// Boxed: a map node has room for eleven values, mostly empty ones.
    replicas: BTreeMap<u64, Box<Replica<S>>>,
    /// (deadline, group) of every group with a timer armed.
    timers: BTreeSet<(u64, u64)>,
    armed: BTreeMap<u64, u64>,
}

impl<S> Default for Node<S> {
    fn default() -> Self {
        Self {
            replicas: BTreeMap::new(),
            timers: BTreeSet::new(),
            armed: BTreeMap::new(),
        }
    }
}

/// A message or tick for a group this node does not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownGroup(pub u64);

impl<S: StateMachine> Node<S> {
    /// An empty node.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a group's replica (replacing one of the same group).
    pub fn insert(&mut self, replica: Replica<S>) {
        let group = replica.config().group;
        self.replicas.insert(group, Box::new(replica));
        self.rearm(group);
    }

    /// Removes a group's replica.
    pub fn remove(&mut self, group: u64) -> Option<Replica<S>> {
        if let Some(deadline) = self.armed.remove(&group) {
            self.timers.remove(&(deadline, group));
        }
        self.replicas.remove(&group).map(|replica| *replica)
    }

    /// A group's replica.
    pub fn replica(&self, group: u64) -> Option<&Replica<S>> {
        self.replicas.get(&group).map(|replica| &**replica)
    }

    /// Every group's replica, by group id.
    pub fn replicas(&self) -> impl Iterator<Item = &Replica<S>> {
        self.replicas.values().map(|replica| &**replica)
    }

    /// Groups held.
    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    /// Whether no group is held.
    pub fn is_empty(&self) -> bool {
        self.replicas.is_empty()
    }

    /// Groups with a timer armed (busy ones); quiescent groups are not counted.
    pub fn armed_groups(&self) -> usize {
        self.armed.len()
    }

    /// The earliest deadline of any group.
    pub fn next_deadline(&self) -> Option<u64> {
        self.timers.iter().next().map(|(deadline, _)| *deadline)
    }

    fn rearm(&mut self, group: u64) {
        if let Some(old) = self.armed.remove(&group) {
            self.timers.remove(&(old, group));
        }
        if let Some(deadline) = self.replicas.get(&group).and_then(|r| r.next_deadline()) {
            self.timers.insert((deadline, group));
            self.armed.insert(group, deadline);
        }
    }

    /// Routes one input to its group; outputs are tagged with the group.
    ///
    /// # Errors
    /// [`UnknownGroup`] if this node holds no replica of `group`.
    pub fn step(
        &mut self,
        now: u64,
        group: u64,
        input: Input,
        out: &mut Vec<(u64, Output)>,
    ) -> Result<(), UnknownGroup> {
        let replica = self.replicas.get_mut(&group).ok_or(UnknownGroup(group))?;
        let mut outputs = Vec::new();
        replica.step(now, input, &mut outputs);
        out.extend(outputs.into_iter().map(|o| (group, o)));
        self.rearm(group);
        Ok(())
    }

    /// Ticks every group whose deadline has come (and no other).
    pub fn tick(&mut self, now: u64, out: &mut Vec<(u64, Output)>) {
        let due: Vec<u64> = self
            .timers
            .range(..=(now, u64::MAX))
            .map(|(_, group)| *group)
            .collect();
        for group in due {
            let _ = self.step(now, group, Input::Tick, out);
        }
    }

    /// The commit heartbeats of the quiescent groups this node leads, to batch per peer
    /// now and then (see [`Replica::commit_heartbeat`]).
    pub fn quiet_heartbeats(&self) -> Vec<(u64, Message)> {
        self.replicas
            .iter()
            .filter(|(group, _)| !self.armed.contains_key(group))
            .filter_map(|(group, r)| Some((*group, r.commit_heartbeat()?)))
            .collect()
    }
}
