//! Replication of the node's groups with `braid_vsr`: the state machines the groups
//! apply, the files of their replicas, the host that feeds a shard's replicas, the
//! metadata group with this node's session in it, and their frames on the replica bus.

pub(crate) mod boot;
pub(crate) mod checkpoints;
pub(crate) mod copies;
pub(crate) mod group_client;
pub(crate) mod journal_file;
pub(crate) mod machine;
pub(crate) mod meta_client;
pub(crate) mod meta_group;
pub(crate) mod outbox;
pub(crate) mod partition_groups;
pub(crate) mod partition_journal;
pub(crate) mod partition_machine;
pub(crate) mod shard_count;
pub(crate) mod shard_host;
pub(crate) mod shared_path;
pub(crate) mod states;
pub(crate) mod status;
pub(crate) mod wire;

#[cfg(test)]
mod shell_sim;

#[cfg(test)]
mod over_bus_tests;
