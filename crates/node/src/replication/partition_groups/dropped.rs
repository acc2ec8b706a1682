//! Groups leaving the shard: a partition deleted, a group whose files were found
//! changed under it (opened again from them), and every group at once when the disk
//! fails under the shard. Produces waiting on them are answered, never left hanging.

use braid_proto::client::ErrorCode;

use super::{group_of, key_of, GroupClient, PartitionGroups};
use crate::error::NodeError;
use crate::layout::PartitionKey;
use crate::replication::shard_host::HostError;

impl PartitionGroups {
    /// Drops a deleted partition's group (its files go with its directory).
    pub(crate) fn remove(&mut self, key: PartitionKey) {
        let group = group_of(key);
        if let Some(mut client) = self.clients.remove(&group) {
            fail_all(
                &mut client,
                &NodeError::new(ErrorCode::PartitionNotFound, "the partition was deleted"),
            );
        }
        self.host.remove_group(group);
    }

    /// The partitions whose files were found changed when woken since the last call,
    /// with why: their groups were dropped (the shard's others go on), and the caller
    /// opens each again with [`PartitionGroups::add`], as a start does. Produces in
    /// flight for them are answered `NotLeader`, so that the producer asks again.
    pub(crate) fn take_reopen(&mut self) -> Vec<(PartitionKey, String)> {
        let reopen = self.host.take_reopen();
        let mut keys = Vec::with_capacity(reopen.len());
        for (group, reason) in reopen {
            // The session stays, and its numbering: the group's replicated state
            // still holds it. (A new client registered again with the same id and
            // attempt, was given the old session back, and numbered from 1 again: the
            // primary answered its first produce with the offsets an old request 1
            // took, acknowledged a second time for another batch, the shell
            // simulator's seed 306785 with damage to sleeping files.)
            if let Some(client) = self.clients.get_mut(&group) {
                fail_all(client, &not_leader());
            }
            self.pending.retain(|g| *g != group);
            self.copies.remove(&group);
            self.repairs.remove(&group);
            if let Some(key) = key_of(group) {
                keys.push((key, reason));
            }
        }
        keys
    }

    /// Stops the shard's groups for `reason` (a partition that cannot be opened again).
    pub(crate) fn stop(&mut self, reason: String) {
        self.fail(HostError::Start { group: 0, reason });
    }

    /// As [`PartitionGroups::fail`], unless the error is `group`'s files found changed
    /// under it (damage met in use): then that group alone is opened again from its
    /// files ([`ShardHost::found_changed`]).
    pub(super) fn fail_group(&mut self, group: u64, err: HostError) {
        if let Err(err) = self.host.found_changed(group, err) {
            self.fail(err);
        }
    }

    /// Stops every group of the shard (a disk failure): each waiting produce is
    /// answered, and the shard reports itself stopped until the node restarts.
    pub(super) fn fail(&mut self, err: HostError) {
        let reason = err.to_string();
        tracing::error!(%reason, "the shard's partition groups stopped: restart the node");
        for client in self.clients.values_mut() {
            fail_all(client, &stopped(&reason));
        }
        self.failed = Some(reason);
    }
}

/// Fails every produce `client` holds with `err`.
pub(super) fn fail_all(client: &mut GroupClient, err: &NodeError) {
    for reply in client.drain() {
        let _ = reply.send(Err(err.clone()));
    }
}

pub(super) fn not_leader() -> NodeError {
    NodeError::new(
        ErrorCode::NotLeader,
        "this node no longer leads the partition; ask ClusterInfo for its primary",
    )
}

pub(crate) fn stopped(reason: &str) -> NodeError {
    NodeError::new(
        ErrorCode::StorageError,
        format!("the partition groups stopped after a disk failure ({reason}); restart the node"),
    )
}
