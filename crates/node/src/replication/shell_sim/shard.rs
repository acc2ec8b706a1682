//! What the node's shard does around its partition groups, as the simulator runs it:
//! the high watermarks it serves (from the moves the groups report) and the partitions
//! it opens again when their files changed; and the damage to a sleeping partition's
//! files that makes them change while a member runs.

use braid_storage::crash::PowerModel;
use braid_storage::disk::hook;

use super::{files, key, partition_dir, Run};
use crate::replication::partition_groups::Dropped;

/// Ticks between a partition's tries to open its files again after one was refused a
/// descriptor (the node's 250 ms).
const REOPEN_RETRY_TICKS: u64 = 25;

impl Run {
    /// Member `m`'s groups report high watermarks that moved: what its shard serves;
    /// then it opens again the partitions whose files a wake found changed.
    pub(super) fn publish(&mut self, m: u8, moved: crate::replication::partition_groups::Moved) {
        let published = &mut self.members[usize::from(m)].published;
        for (key, mark) in moved {
            let at = published.entry(key.partition).or_insert(0);
            *at = (*at).max(mark);
        }
        self.reopen(m);
    }

    /// As the node's shard: a partition whose group was dropped because its files
    /// changed while asleep, or an open of them was refused a descriptor, is opened
    /// again from them (`Shard::reopen_changed_files`); one whose open is refused a
    /// descriptor tries again every [`REOPEN_RETRY_TICKS`] (`Shard::retry_waiting_reopens`).
    fn reopen(&mut self, m: u8) {
        let log_config = self.log_config();
        let now_ms = self.now_ms();
        let tick = self.tick;
        let member = &mut self.members[usize::from(m)];
        let Some(groups) = member.groups.as_mut() else {
            return;
        };
        let mut reopen: Vec<_> = groups
            .take_reopen()
            .into_iter()
            .filter(|(key, _)| !member.reopen_waiting.contains_key(&key.partition))
            .collect();
        let due: Vec<u32> = member
            .reopen_waiting
            .iter()
            .filter(|(_, at)| **at <= tick)
            .map(|(p, _)| *p)
            .collect();
        for p in due {
            member.reopen_waiting.remove(&p);
            reopen.push((key(p), Dropped::Reopen("waited for descriptors".into())));
        }
        if reopen.is_empty() {
            return;
        }
        let mut failed = None;
        for (key, reason) in reopen {
            if self.trace {
                eprintln!(
                    "t{} m{m} opens p{} again: {reason:?}",
                    self.tick, key.partition
                );
            }
            self.outcome.reopened += 1;
            self.served.forget_partition(m, key.partition);
            self.scrub_floor.remove(&(m, key.partition));
            let dir = partition_dir(&member.dir, key.partition);
            match groups.add(key, &dir, log_config, now_ms) {
                // Its readers' view starts again from what the open found.
                Ok(mark) => {
                    member.published.insert(key.partition, mark);
                }
                Err(err) if err.is_out_of_descriptors() => {
                    self.outcome.opens_refused += 1;
                    groups.drop_half_opened(key);
                    member
                        .reopen_waiting
                        .insert(key.partition, tick + REOPEN_RETRY_TICKS);
                }
                Err(err) => {
                    failed.get_or_insert(format!(
                        "member {m} cannot open partition {} again: {err}",
                        key.partition
                    ));
                }
            }
        }
        if let Some(what) = failed {
            self.fail(what);
            return;
        }
        match groups.recover_opened() {
            Ok(moved) => self.publish(m, moved),
            Err(err) => self.fail(format!("member {m} recovering reopened partitions: {err}")),
        }
    }

    /// While faults run, now and then one member runs out of file descriptors for a
    /// while ([`super::Shape::descriptors_out_per_10k`]): every open and creation
    /// under its `partitions/` is refused EMFILE until this is called again with
    /// `faults` false, or its window ends.
    pub(super) fn refuse_descriptors(&mut self, faults: bool) {
        if !faults {
            self.descriptors_out = None;
        } else if let Some((_, until)) = self.descriptors_out {
            if until <= self.tick {
                self.descriptors_out = None;
            }
        } else if self.descriptor_draws.below(10_000) < self.shape.descriptors_out_per_10k {
            let m = self.descriptor_draws.below(u64::from(self.member_count())) as u8;
            let ticks = 5 + self.descriptor_draws.below(200);
            self.descriptors_out = Some((m, self.tick + ticks));
            self.outcome.descriptors_out += 1;
            if self.trace {
                eprintln!("t{} m{m} out of descriptors for {ticks} ticks", self.tick);
            }
        }
        let dir = self
            .descriptors_out
            .map(|(m, _)| self.members[usize::from(m)].dir.join("partitions"));
        hook::set_no_descriptors_under(dir);
        if faults && self.shape.descriptors_out_per_10k > 0 {
            self.release_files();
        }
    }

    /// As the node's shard after it opened a partition (`Shard::settle_opened`), at any
    /// time: now and then a partition whose files are awake lets its log's handles go,
    /// to be opened again by its next use (a write, a sync, a read), which a member out
    /// of descriptors may refuse.
    fn release_files(&mut self) {
        if !self.descriptor_draws.chance(5) {
            return;
        }
        let m = self.descriptor_draws.below(u64::from(self.member_count())) as usize;
        let p = self
            .descriptor_draws
            .below(u64::from(self.shape.partitions)) as u32;
        if let Some(groups) = self.members[m].groups.as_mut() {
            // A failure (an index that could not be written) is logged by the node and
            // changes nothing: the files stay open.
            let _ = groups.release_files(key(p));
        }
    }

    /// Damages the files of a sleeping partition of the one member whose disk may be
    /// damaged, while it runs ([`Shape::asleep_damage_per_10k`]). False while it is
    /// down or none of its partitions sleeps (tried again at the next tick).
    pub(super) fn damage_asleep(&mut self) -> bool {
        self.drain_trace();
        let m = (self.seed % u64::from(self.shape.members)) as u8;
        let kinds = self.shape.kinds();
        let member = &mut self.members[usize::from(m)];
        let Some(groups) = member.groups.as_ref() else {
            return false;
        };
        let asleep: Vec<u32> = (0..self.shape.partitions)
            .filter(|p| groups.journal(key(*p)).is_none())
            .collect();
        if asleep.is_empty() {
            return false;
        }
        let p = asleep[self.asleep_draws.below(asleep.len() as u64) as usize];
        // The pass under way may be past the damage: the one after it is whole.
        let passes = groups.scrubbed(key(p)).map_or(0, |(passes, _)| passes);
        self.scrub_floor.insert((m, p), passes + 1);
        let dir = partition_dir(&member.dir, p);
        let damaged = files::damage_asleep(&dir, &mut self.asleep_draws, kinds);
        // What the model held unsynced may now be on disk or not: all of it durable is
        // one outcome a disk allows.
        let result = damaged.and_then(|what| Ok((what, PowerModel::of_dir(&member.dir)?)));
        match result {
            Ok((what, power)) => {
                member.power = power;
                if let Some(what) = what {
                    self.outcome.damaged_files += 1;
                    if self.trace {
                        eprintln!("t{} m{m} damaged asleep: {what}", self.tick);
                    }
                }
            }
            Err(err) => self.fail(format!("member {m}: damaging sleeping files: {err}")),
        }
        true
    }

    /// The high watermark member `m`'s shard serves partition `p` with.
    fn published(&self, m: u8, p: u32) -> u64 {
        self.members[usize::from(m)]
            .published
            .get(&p)
            .copied()
            .unwrap_or(0)
    }

    /// Once converged, each member's shard serves every partition up to what its log
    /// holds committed: a mark left behind hides acknowledged records from readers
    /// (the outside review 45's F1: a member that took a peer's state served hw 0
    /// until the next produce).
    pub(super) fn check_published(&self) -> Result<(), String> {
        for m in 0..self.member_count() {
            let Some(groups) = self.members[usize::from(m)].groups.as_ref() else {
                continue;
            };
            for p in 0..self.shape.partitions {
                let (served, held) = (self.published(m, p), groups.high_watermark(key(p)));
                if served != held {
                    return Err(format!(
                        "member {m} serves partition {p} up to {served} while its log holds \
                         {held} committed"
                    ));
                }
            }
        }
        Ok(())
    }
}
