//! Groups leaving the shard: a partition deleted, a group whose files were found
//! changed under it (opened again from them), and every group at once when the disk
//! fails under the shard. Produces waiting on them are answered, never left hanging.

use braid_proto::client::ErrorCode;

use super::{group_of, key_of, GroupClient, PartitionGroups};
use crate::error::NodeError;
use crate::layout::PartitionKey;
use crate::partition::ReadDamage;
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

    /// The partitions dropped since the last call, with why: their files were found
    /// changed when woken (the caller opens each again with [`PartitionGroups::add`],
    /// as a start does), or a lone replica met damage in use (the caller refuses it).
    /// The shard's other groups go on. Produces in flight for them are answered
    /// `NotLeader`, so that the producer asks again.
    pub(crate) fn take_reopen(&mut self) -> Vec<(PartitionKey, Dropped)> {
        let reopen = self.host.take_reopen();
        let mut keys = Vec::with_capacity(reopen.len());
        for (group, reason) in reopen {
            let dropped = match self.refused_lone.remove(&group) {
                Some(reason) => Dropped::Refuse(reason),
                None => Dropped::Reopen(reason),
            };
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
                keys.push((key, dropped));
            }
        }
        keys
    }

    /// Drops `key`'s group if it was added by an open that then failed (refused a file
    /// descriptor half way): its durable state stays, for the next open, which the
    /// caller schedules. It comes back from [`PartitionGroups::take_reopen`].
    pub(crate) fn drop_half_opened(&mut self, key: PartitionKey) {
        let group = group_of(key);
        self.opened_lone.retain(|g| *g != group);
        if self.host.holds(group) {
            // Nothing in its files changed: this boot still vouches for its journal.
            self.host
                .drop_unchanged(group, "an open refused a file descriptor".into());
        }
    }

    /// A read met damage in `key`'s committed log: a member asks a peer for its copy
    /// of a damaged batch now, not when the scrub comes round to it (the scrub finds
    /// the batch of a log unreadable from an offset); a lone replica, with no peer,
    /// refuses the partition.
    pub(crate) fn damage_met(&mut self, key: PartitionKey, damage: ReadDamage) {
        let group = group_of(key);
        match damage {
            ReadDamage::Batch(offset) | ReadDamage::From(offset) if self.members == 1 => {
                self.refuse_damaged(group, offset);
            }
            ReadDamage::Batch(offset) => {
                if let Some(journal) = self.host.journal_mut(group) {
                    journal.note_damage(offset);
                }
            }
            ReadDamage::From(_) => {}
        }
    }

    /// A lone replica met a damaged batch of `group`'s committed log in use: the
    /// partition is refused as its start would refuse it, taking no more writes. (It
    /// took them: acknowledged past the damage, they were records no read could reach,
    /// until a restart refused the partition: an outside review of issue 24.)
    pub(super) fn refuse_damaged(&mut self, group: u64, offset: u64) {
        let Some(journal) = self.host.journal_mut(group) else {
            return;
        };
        let log = journal.log();
        let place = if (log.start_offset()..log.next_offset()).contains(&offset) {
            let segment = format!("{:020}.log", log.segment_base(offset));
            log.dir().join(segment).display().to_string()
        } else {
            format!("the log in {}", log.dir().display())
        };
        let reason = format!(
            "the batch at offset {offset} in {place} is damaged (it does not read back \
             whole, or its CRC does not check), and a lone replica has no peer to repair \
             it from (see \"Damage a replica finds in its replication files\" in \
             docs/operations.md)"
        );
        self.refused_lone.insert(group, reason.clone());
        self.host.drop_for_reopen(group, reason);
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

/// A group dropped from the shard while the node runs, and what becomes of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Dropped {
    /// Its files changed under it: opened again from them, as a start opens them (a
    /// member repairs what changed from its peers; a lone replica refuses damage).
    Reopen(String),
    /// A lone replica met damage in its committed log in use, which it has no peer to
    /// repair from: refused as its start refuses it, without opening the files again
    /// (an open reads the batches its journal names, not every batch).
    Refuse(String),
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
