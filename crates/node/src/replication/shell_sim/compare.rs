//! The end of a run: every member's log compared, batch by batch.

use std::collections::BTreeMap;

use super::files::{describe_batch, read_batches, values_of};
use super::{key, Run};

/// The records every member's log of each partition holds alike, by offset, from the
/// latest start of any member's log.
pub(super) struct Held {
    partitions: Vec<BTreeMap<u64, Option<Vec<u8>>>>,
}

impl Held {
    pub(super) fn records(&self) -> u64 {
        self.partitions.iter().map(|p| p.len() as u64).sum()
    }

    /// Whether `later` holds the same records as this, from where either starts: a
    /// member's retention may have deleted segments meanwhile (its segments' bounds
    /// differ from its peers', so its start may pass theirs), nothing else.
    pub(super) fn kept_in(&self, later: &Held) -> Result<(), String> {
        for (p, (before, after)) in self.partitions.iter().zip(&later.partitions).enumerate() {
            let from = match (before.keys().next(), after.keys().next()) {
                (Some(a), Some(b)) => *a.max(b),
                _ => 0,
            };
            if !before.range(from..).eq(after.range(from..)) {
                return Err(format!(
                    "a clean restart changed partition {p}'s log: {} records from offset \
                     {from}, then {}",
                    before.range(from..).count(),
                    after.range(from..).count()
                ));
            }
        }
        Ok(())
    }
}

impl Run {
    /// Every member's log of every partition, batch by batch: the same bytes at the
    /// same offsets on all, every acknowledged record at its offset. Returns the
    /// records the logs hold.
    pub(super) fn compare_logs(&mut self) -> Result<Held, String> {
        let mut held = Held {
            partitions: Vec::new(),
        };
        for p in 0..self.shape.partitions {
            let mut logs = Vec::new();
            let mut unreadable = None;
            // Each member's retention deleted its own oldest segments: the logs are
            // compared from the latest start.
            let mut from = 0;
            let mut starts = Vec::new();
            for m in 0..self.member_count() {
                if let Some(log) = self.members[usize::from(m)]
                    .groups
                    .as_mut()
                    .and_then(|groups| groups.log(key(p)))
                {
                    from = from.max(log.start_offset());
                    starts.push(log.start_offset());
                }
            }
            for m in 0..self.member_count() {
                let groups = self.members[usize::from(m)]
                    .groups
                    .as_mut()
                    .ok_or_else(|| format!("member {m} is down at the end"))?;
                let mark = groups.high_watermark(key(p));
                let log = groups
                    .log(key(p))
                    .ok_or_else(|| format!("member {m} has no partition {p}"))?;
                let batches = read_batches(log, from, mark);
                logs.push((mark, batches.0));
                if let Some(err) = batches.1 {
                    unreadable.get_or_insert(format!("member {m} partition {p}: {err}"));
                }
            }
            if self.trace {
                for m in 0..self.member_count() {
                    let Some(groups) = self.members[usize::from(m)].groups.as_ref() else {
                        continue;
                    };
                    let Some(journal) = groups.journal(key(p)) else {
                        continue;
                    };
                    let tip = journal.tip();
                    let entries: Vec<String> = journal
                        .entries(tip.saturating_sub(6), tip + 20)
                        .iter()
                        .map(|(op, sum, base)| format!("{op}:{:x}@{base:?}", sum >> 112))
                        .collect();
                    let batches: Vec<String> = logs[usize::from(m)]
                        .1
                        .iter()
                        .rev()
                        .take(12)
                        .map(|(base, bytes)| format!("{base}+{}", bytes.len()))
                        .collect();
                    let start = starts.get(usize::from(m));
                    eprintln!(
                        "m{m} p{p}: journal {entries:?}; log from {start:?}, last {batches:?}"
                    );
                }
            }
            if let Some(err) = unreadable {
                return Err(err);
            }
            let (mark, first) = &logs[0];
            for (m, (other_mark, other)) in logs.iter().enumerate().skip(1) {
                if other_mark != mark {
                    return Err(format!(
                        "partition {p}: member 0 ends at {mark}, member {m} at {other_mark}"
                    ));
                }
                if let Some(at) = first.iter().zip(other).position(|(a, b)| a != b) {
                    return Err(format!(
                        "partition {p}: member 0 and member {m} differ at batch {at}: {} vs {}",
                        describe_batch(&first[at]),
                        describe_batch(&other[at])
                    ));
                }
                if first.len() != other.len() {
                    return Err(format!(
                        "partition {p}: member 0 holds {} batches, member {m} {}",
                        first.len(),
                        other.len()
                    ));
                }
            }
            let values = values_of(first)?;
            let start = values.keys().next().copied().unwrap_or(from);
            if start != from && start < *mark {
                return Err(format!(
                    "partition {p}: the logs start at {from}, their first record is {start}"
                ));
            }
            if let Some((i, offset)) = values
                .keys()
                .enumerate()
                .find(|(i, offset)| **offset != start + *i as u64)
            {
                return Err(format!(
                    "partition {p}: the log skips from offset {} to {offset}",
                    start + i as u64
                ));
            }
            // Nothing is stored twice: every value is produced once, and a session's
            // request sent again is the same values, which must not be stored again.
            let mut seen = std::collections::HashMap::new();
            for (offset, value) in &values {
                if let Some(value) = value {
                    if let Some(earlier) = seen.insert(value.as_slice(), *offset) {
                        return Err(format!(
                            "partition {p}: {} is stored twice, at offsets {earlier} and {offset}",
                            String::from_utf8_lossy(value)
                        ));
                    }
                }
            }
            if from == 0 {
                for (_, value) in self
                    .sessions
                    .stored_somewhere
                    .iter()
                    .filter(|(partition, _)| *partition == p)
                {
                    if !seen.contains_key(value.as_slice()) {
                        return Err(format!(
                            "partition {p}: {} was answered stored before (DuplicateRequest), \
                             and no log holds it",
                            String::from_utf8_lossy(value)
                        ));
                    }
                }
            }
            for ((_, offset), value) in self.acked.range((p, from)..(p + 1, 0)) {
                match values.get(offset) {
                    Some(Some(held)) if held == value => {}
                    held => {
                        return Err(format!(
                            "partition {p} offset {offset}: acknowledged {}, the logs hold {:?}",
                            String::from_utf8_lossy(value),
                            held.as_ref().map(|h| h
                                .as_ref()
                                .map(|v| String::from_utf8_lossy(v).into_owned()))
                        ))
                    }
                }
            }
            held.partitions.push(values);
        }
        Ok(held)
    }

    pub(super) fn restart_all_cleanly(&mut self) -> Result<(), String> {
        for m in 0..self.member_count() {
            if let Some(mut groups) = self.members[usize::from(m)].groups.take() {
                let (slept, woken) = groups.sleep_counts();
                self.outcome.files_slept += slept;
                self.outcome.files_woken += woken;
                self.outcome.files_released_over_budget += groups.released_over_budget();
                groups.close();
            }
            self.members[usize::from(m)].meta = None;
            self.members[usize::from(m)].syncs = None;
            self.boot(m);
            if let Some(what) = self.failure.take() {
                return Err(what);
            }
        }
        // Let them find their views again before reading.
        // As long as the first convergence may take: with five members and four times
        // the lost frames, members restarted at one instant take some 2,500 ticks to
        // agree on a view again.
        for _ in 0..self.shape.liveness_ticks {
            self.step(false);
            if let Some(what) = self.failure.take() {
                return Err(what);
            }
            if self.converged() {
                return Ok(());
            }
        }
        Err(format!(
            "no convergence after a clean restart: {}",
            self.describe()
        ))
    }
}
