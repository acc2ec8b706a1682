//! Replication of the node's groups with `braid_vsr`: the state machines the groups
//! apply, and the store of their durable states. The host that feeds each shard's replicas, and the glue to the replica bus,
//! join here as the cluster work lands.

pub(crate) mod checkpoints;
pub(crate) mod copies;
pub(crate) mod journal_file;
pub(crate) mod machine;
pub(crate) mod shard_host;
pub(crate) mod states;
pub(crate) mod wire;

#[cfg(test)]
mod over_bus_tests;
