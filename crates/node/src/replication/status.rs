//! What each group's replica says of itself (its view and status, the op it holds,
//! the commit it knows and the one it applied, the checksum at its commit point), and
//! the board the shards publish it on. `/replication`, `/health` and `/metrics` read
//! the board; the fault suite compares each group's (commit, checksum) across members.
//!
//! Pure: a shard builds its rows from its replicas on its timer and replaces its row
//! set whole, so a reader never sees a shard half-published.

use braid_vsr::{Replica, ReplicaId, StateMachine, Status};

/// One group's replica on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GroupStatus {
    pub(crate) group: u64,
    pub(crate) view: u64,
    pub(crate) status: Status,
    /// The primary of `view`.
    pub(crate) primary: ReplicaId,
    /// The highest op in its journal.
    pub(crate) op: u64,
    /// The highest op it applied.
    pub(crate) commit_min: u64,
    /// The highest op it knows committed.
    pub(crate) commit_max: u64,
    /// The checksum of op `commit_min`, if its header is held.
    pub(crate) commit_checksum: Option<RowChecksum>,
    /// Whether its journal may be trusted (false after a power loss or a lost disk,
    /// until the group has shown it what it lost).
    pub(crate) trusted: bool,
    /// Times it stepped down as a primary whose prepares committed nothing (it lost
    /// its quorum), since the replica started.
    pub(crate) step_downs: u32,
    /// For a partition: what its journal holds in the log (see [`JournalProgress`]).
    pub(crate) journal: Option<JournalProgress>,
}

/// A checksum kept as bytes: a `u128` field would align every row to 16 bytes, and the
/// board holds a row per group (a row of 128 bytes where 104 do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowChecksum([u8; 16]);

impl From<u128> for RowChecksum {
    fn from(checksum: u128) -> Self {
        Self(checksum.to_be_bytes())
    }
}

impl RowChecksum {
    /// The checksum.
    pub(crate) fn get(self) -> u128 {
        u128::from_be_bytes(self.0)
    }
}

/// How far a partition's journal has its bodies in the log, for an operator who asks
/// why a replica does not catch up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JournalProgress {
    /// The highest op whose batch is in the log with every op below it.
    pub(crate) tip: u64,
    /// Prepares above the tip waiting for an op below them.
    pub(crate) waiting: u64,
    /// A state transfer running: the offset copied to and the offset it copies up to.
    pub(crate) copying: Option<(u64, u64)>,
}

impl GroupStatus {
    /// The status of `replica` now.
    pub(crate) fn of<S: StateMachine>(replica: &Replica<S>) -> Self {
        let commit_min = replica.commit_min();
        Self {
            group: replica.config().group,
            view: replica.view(),
            status: replica.status(),
            primary: replica.primary_of(replica.view()),
            op: replica.op(),
            commit_min,
            commit_max: replica.commit_max(),
            commit_checksum: replica
                .header(commit_min)
                .map(|h| RowChecksum::from(h.checksum)),
            trusted: replica.journal_trusted(),
            step_downs: replica.step_downs(),
            journal: None,
        }
    }

    /// Committed ops it knows of and has not applied yet.
    pub(crate) fn commit_lag(&self) -> u64 {
        self.commit_max.saturating_sub(self.commit_min)
    }

    /// In normal status (so it heard from its view's primary since it started),
    /// applied all it knows committed, and not copying its log from a peer (until the
    /// copy is done it acknowledges nothing above the checkpoint, so it backs no
    /// quorum: an outside review found `/ready` 200 during a copy, and the next member
    /// stopped in a rolling restart stalled the partition's writes for the copy's
    /// length). An untrusted journal does not count against it: under `fsync = never`
    /// every restart is untrusted until the next view change, which a healthy group
    /// may never have; it only limits the replica's votes.
    pub(crate) fn caught_up(&self) -> bool {
        self.status == Status::Normal
            && self.commit_lag() == 0
            && self.journal.is_none_or(|j| j.copying.is_none())
    }

    /// The status as the client protocol carries it.
    pub(crate) fn replica_status(&self) -> braid_proto::client::ReplicaStatus {
        use braid_proto::client::ReplicaStatus;
        match self.status {
            Status::Normal => ReplicaStatus::Normal,
            Status::ViewChange => ReplicaStatus::ViewChange,
            Status::Recovering => ReplicaStatus::Recovering,
        }
    }

    /// The status as a word, for JSON.
    pub(crate) fn status_name(&self) -> &'static str {
        self.replica_status().name()
    }
}

/// What a shard published last, and the views it has seen its groups pass.
#[derive(Debug, Default)]
struct ShardRows {
    groups: Vec<GroupStatus>,
    views_passed: u64,
    step_downs: u64,
    published: bool,
    /// The shard's partition groups stopped after a failed disk operation.
    stopped: bool,
}

/// Every shard's published rows.
#[derive(Debug)]
pub(crate) struct Board {
    shards: Vec<std::sync::Mutex<ShardRows>>,
}

/// The node's groups summed up (for `/health` and `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    pub(crate) groups: u64,
    pub(crate) led: u64,
    pub(crate) in_view_change: u64,
    pub(crate) behind: u64,
    pub(crate) commit_lag: u64,
    /// Views the groups have passed since the node started, as their shards saw them.
    pub(crate) views_passed: u64,
    /// Primaries that stepped down since the node started (lost their quorum).
    pub(crate) step_downs: u64,
    /// Shards that have not published yet (just started).
    pub(crate) shards_silent: u64,
    /// Shards whose partition groups stopped after a failed disk operation: their
    /// partitions are served by no one here until the node restarts.
    pub(crate) shards_stopped: u64,
}

impl Summary {
    /// Every shard has published and every group is caught up.
    pub(crate) fn caught_up(&self) -> bool {
        self.shards_silent == 0 && self.behind == 0 && self.shards_stopped == 0
    }

    /// `/health`'s answer: `"status"` is `"ok"`, or `"degraded"` while a shard's
    /// partition groups are stopped after a failed disk operation (its partitions are
    /// served by no one here until the node restarts).
    pub(crate) fn health_json(&self) -> String {
        let status = if self.shards_stopped > 0 {
            "degraded"
        } else {
            "ok"
        };
        format!(
            "{{\"status\":\"{status}\",\"caught_up\":{},\"groups\":{},\"groups_led\":{},\"groups_behind\":{},\"groups_in_view_change\":{},\"commit_lag_ops\":{},\"shards_stopped\":{}}}\n",
            self.caught_up(),
            self.groups,
            self.led,
            self.behind,
            self.in_view_change,
            self.commit_lag,
            self.shards_stopped
        )
    }
}

impl Board {
    pub(crate) fn new(shards: usize) -> Self {
        Self {
            shards: (0..shards).map(|_| std::sync::Mutex::default()).collect(),
        }
    }

    /// Replaces `shard`'s rows with `groups`. A group whose view grew since the last
    /// publication counts the views it passed, and its step-downs since then.
    pub(crate) fn publish(&self, shard: usize, mut groups: Vec<GroupStatus>) {
        let Some(slot) = self.shards.get(shard) else {
            return;
        };
        groups.sort_unstable_by_key(|g| g.group);
        let Ok(mut rows) = slot.lock() else {
            return;
        };
        let mut passed = 0;
        let mut step_downs = 0;
        for group in &groups {
            let before = rows.groups.binary_search_by_key(&group.group, |g| g.group);
            if let Ok(i) = before {
                passed += group.view.saturating_sub(rows.groups[i].view);
            }
            let seen = before.map_or(0, |i| rows.groups[i].step_downs);
            step_downs += u64::from(group.step_downs.saturating_sub(seen));
        }
        rows.views_passed += passed;
        rows.step_downs += step_downs;
        rows.groups = groups;
        rows.published = true;
    }

    /// Replaces the rows of `changed` groups in `shard`'s (adding new ones), keeping the
    /// others: what a shard publishes between full publications, so that an idle node
    /// of many groups does not rebuild every row ten times a second. Counts views passed
    /// and step-downs as [`Board::publish`] does.
    /// Shard `shard`'s partition groups stopped: the node is not ready until restarted.
    pub(crate) fn set_stopped(&self, shard: usize) {
        if let Some(Ok(mut rows)) = self.shards.get(shard).map(|slot| slot.lock()) {
            rows.stopped = true;
        }
    }

    pub(crate) fn update(&self, shard: usize, changed: Vec<GroupStatus>) {
        let Some(slot) = self.shards.get(shard) else {
            return;
        };
        let Ok(mut rows) = slot.lock() else {
            return;
        };
        for group in changed {
            match rows.groups.binary_search_by_key(&group.group, |g| g.group) {
                Ok(i) => {
                    let before = &rows.groups[i];
                    let passed = group.view.saturating_sub(before.view);
                    let step_downs = u64::from(group.step_downs.saturating_sub(before.step_downs));
                    rows.views_passed += passed;
                    rows.step_downs += step_downs;
                    rows.groups[i] = group;
                }
                Err(i) => {
                    rows.step_downs += u64::from(group.step_downs);
                    rows.groups.insert(i, group);
                }
            }
        }
        rows.published = true;
    }

    /// Every published row, by group.
    pub(crate) fn rows(&self) -> Vec<GroupStatus> {
        let mut all: Vec<GroupStatus> = self
            .shards
            .iter()
            .filter_map(|slot| slot.lock().ok().map(|rows| rows.groups.clone()))
            .flatten()
            .collect();
        all.sort_unstable_by_key(|g| g.group);
        all
    }

    /// The rows summed up; `me` is this node's member id (for the groups it leads).
    pub(crate) fn summary(&self, me: ReplicaId) -> Summary {
        let mut summary = Summary::default();
        for slot in &self.shards {
            let Ok(rows) = slot.lock() else {
                continue;
            };
            summary.views_passed += rows.views_passed;
            summary.step_downs += rows.step_downs;
            summary.shards_silent += u64::from(!rows.published);
            summary.shards_stopped += u64::from(rows.stopped);
            for group in &rows.groups {
                summary.groups += 1;
                summary.led += u64::from(group.status == Status::Normal && group.primary == me);
                summary.in_view_change += u64::from(group.status != Status::Normal);
                summary.behind += u64::from(!group.caught_up());
                summary.commit_lag += group.commit_lag();
            }
        }
        summary
    }
}

/// `rows` as JSON: `{"node":ID,"groups":[{...}, ...]}` (checksums as 32 hex digits).
pub(crate) fn rows_json(node: ReplicaId, rows: &[GroupStatus]) -> String {
    let mut out = format!("{{\"node\":{node},\"groups\":[");
    for (i, g) in rows.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let checksum = g
            .commit_checksum
            .map_or_else(|| "null".to_string(), |c| format!("\"{:032x}\"", c.get()));
        let journal = g.journal.map_or_else(String::new, |j| {
            let copying = j.copying.map_or_else(
                || "null".to_string(),
                |(at, to)| format!("{{\"at\":{at},\"to\":{to}}}"),
            );
            format!(
                ",\"journal_tip\":{},\"journal_waiting\":{},\"copying\":{copying}",
                j.tip, j.waiting
            )
        });
        out.push_str(&format!(
            "{{\"group\":{},\"view\":{},\"status\":\"{}\",\"primary\":{},\"op\":{},\"commit_min\":{},\"commit_max\":{},\"commit_checksum\":{checksum},\"trusted\":{}{journal}}}",
            g.group,
            g.view,
            g.status_name(),
            g.primary,
            g.op,
            g.commit_min,
            g.commit_max,
            g.trusted
        ));
    }
    out.push_str("]}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(group: u64, view: u64, status: Status, commit: (u64, u64)) -> GroupStatus {
        GroupStatus {
            group,
            view,
            status,
            primary: (view % 3) as ReplicaId,
            op: commit.1,
            commit_min: commit.0,
            commit_max: commit.1,
            commit_checksum: Some(RowChecksum::from(7)),
            trusted: true,
            step_downs: 0,
            journal: None,
        }
    }

    #[test]
    fn the_summary_counts_leaders_laggards_and_views_passed() {
        let board = Board::new(2);
        assert!(!board.summary(0).caught_up(), "nothing published yet");
        board.publish(0, vec![row(0, 0, Status::Normal, (5, 5))]);
        assert!(!board.summary(0).caught_up(), "shard 1 has not published");
        board.publish(1, vec![row(9, 1, Status::Normal, (3, 3))]);
        // Group 0 moves to view 2 and is behind; group 9 is changing view.
        board.publish(0, vec![row(0, 2, Status::Normal, (5, 8))]);
        board.publish(1, vec![row(9, 4, Status::ViewChange, (3, 3))]);
        let summary = board.summary(2);
        assert_eq!(summary.groups, 2);
        assert_eq!(summary.led, 1, "member 2 leads view 2 of group 0");
        assert_eq!(summary.in_view_change, 1);
        assert_eq!(summary.behind, 2);
        assert_eq!(summary.commit_lag, 3);
        assert_eq!(summary.views_passed, 2 + 3);
        assert!(!summary.caught_up());
        // Group 9 stepped down twice: counted once, however often it is published.
        let mut stepped = row(9, 4, Status::ViewChange, (3, 3));
        stepped.step_downs = 2;
        board.publish(1, vec![stepped]);
        board.publish(1, vec![stepped]);
        assert_eq!(board.summary(2).step_downs, 2);
        board.publish(0, vec![row(0, 2, Status::Normal, (8, 8))]);
        // A partition copying its log from a peer is not caught up, whatever its
        // commit says.
        let mut copying = row(9, 4, Status::Normal, (3, 3));
        copying.journal = Some(JournalProgress {
            tip: 3,
            waiting: 0,
            copying: Some((100, 900)),
        });
        board.publish(1, vec![copying]);
        assert!(!board.summary(2).caught_up());
        assert_eq!(board.summary(2).behind, 1);
        board.publish(1, vec![row(9, 4, Status::Normal, (3, 3))]);
        let summary = board.summary(2);
        assert!(summary.caught_up());
        assert!(summary.health_json().contains("\"caught_up\":true"));
        assert_eq!(
            board.rows().iter().map(|g| g.group).collect::<Vec<_>>(),
            [0, 9]
        );
    }

    /// An update replaces the rows it names and keeps the others, counting views and
    /// step-downs as a full publication does.
    #[test]
    fn an_update_changes_only_the_rows_it_names() {
        let board = Board::new(1);
        board.publish(
            0,
            vec![
                row(1, 0, Status::Normal, (5, 5)),
                row(4, 0, Status::Normal, (2, 2)),
            ],
        );
        let mut stepped = row(4, 3, Status::ViewChange, (2, 2));
        stepped.step_downs = 1;
        board.update(0, vec![stepped, row(2, 0, Status::Normal, (1, 1))]);
        let rows = board.rows();
        assert_eq!(rows.iter().map(|g| g.group).collect::<Vec<_>>(), [1, 2, 4]);
        assert_eq!(rows[0].commit_min, 5, "group 1 kept as it was");
        assert_eq!(rows[2].status, Status::ViewChange);
        let summary = board.summary(0);
        assert_eq!(summary.views_passed, 3);
        assert_eq!(summary.step_downs, 1);
        board.update(0, vec![stepped]);
        assert_eq!(board.summary(0).step_downs, 1, "counted once");
    }

    #[test]
    fn rows_render_as_json_with_hex_checksums() {
        let mut r = row(3, 1, Status::Recovering, (2, 2));
        r.commit_checksum = Some(RowChecksum::from(0xab));
        let json = rows_json(1, &[r]);
        assert!(json.starts_with(
            "{\"node\":1,\"groups\":[{\"group\":3,\"view\":1,\"status\":\"recovering\""
        ));
        assert!(json.contains("\"commit_checksum\":\"000000000000000000000000000000ab\""));
        assert_eq!(
            std::mem::size_of::<GroupStatus>(),
            104,
            "a board row per group"
        );
        assert!(json.contains("\"trusted\":true}]}"));
    }
}
