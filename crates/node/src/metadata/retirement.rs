//! Retiring ended client sessions, as the metadata holds it (seed 001): each node's
//! last report of a walk (its watermark and the copies it could not prove), the op
//! through which ended sessions are retired (forgotten), and the partitions that owe
//! a retirement. A node reports with [`ReportRetirement`]; once every node has
//! reported past what is retired, the coordinator commits [`FinalizeSession`] through
//! the lowest watermark, and its apply forgets every ended session at or below it.

use std::collections::BTreeMap;

use braid_proto::wire::{WireError, WireReader, WireWrite};

use super::op::Change;
use super::{MetaError, Metadata, Touch};

/// A partition, by topic id and partition id (as the layout keys it).
pub type PartitionRef = (u32, u32);

/// The most copies one report or finalize names as debt: past it a node reports
/// again later instead (a report is one metadata op).
pub const DEBT_MAX: usize = 10_000;

/// One node's last report of a walk.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RetireReport {
    /// The watermark of the walk: every session ended at or below it is proven gone
    /// from the node's copies, but for `debt`.
    pub watermark: u64,
    /// The copies the walk could not prove, in order.
    pub debt: Vec<PartitionRef>,
}

/// The metadata's side of retirement.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Retirement {
    /// Every session ended at or below this op is retired: forgotten.
    pub retired_through: u64,
    /// Each node's last report, by node id.
    pub reports: BTreeMap<u8, RetireReport>,
    /// Partitions that owe the retirement through an op: they take no new session
    /// until a barrier raised their frontier to it.
    pub debts: BTreeMap<PartitionRef, u64>,
}

fn put_refs(out: &mut Vec<u8>, refs: &[PartitionRef]) {
    out.put_u32_be(refs.len() as u32);
    for (topic, partition) in refs {
        out.put_u32_be(*topic);
        out.put_u32_be(*partition);
    }
}

fn refs(r: &mut WireReader<'_>) -> Result<Vec<PartitionRef>, WireError> {
    let mut out = Vec::new();
    for _ in 0..r.count("debt", 8)? {
        out.push((r.u32("topic_id")?, r.u32("partition")?));
    }
    Ok(out)
}

impl Retirement {
    /// Appends the retirement section of the metadata snapshot: `retired_through:
    /// u64`, `reports: u32` then `node: u8, watermark: u64, debt` each, `debts: u32`
    /// then `topic_id: u32, partition: u32, owed: u64` each; a debt list is `count:
    /// u32` then `topic_id: u32, partition: u32` each.
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        out.put_u64_be(self.retired_through);
        out.put_u32_be(self.reports.len() as u32);
        for (node, report) in &self.reports {
            out.put_u8_be(*node);
            out.put_u64_be(report.watermark);
            put_refs(out, &report.debt);
        }
        out.put_u32_be(self.debts.len() as u32);
        for ((topic, partition), owed) in &self.debts {
            out.put_u32_be(*topic);
            out.put_u32_be(*partition);
            out.put_u64_be(*owed);
        }
    }

    /// Reads what [`Retirement::encode`] wrote.
    pub(super) fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        let retired_through = r.u64("retired_through")?;
        let mut reports = BTreeMap::new();
        for _ in 0..r.count("reports", 13)? {
            let node = r.u8("node")?;
            let watermark = r.u64("watermark")?;
            reports.insert(
                node,
                RetireReport {
                    watermark,
                    debt: refs(r)?,
                },
            );
        }
        let mut debts = BTreeMap::new();
        for _ in 0..r.count("debts", 16)? {
            let key = (r.u32("topic_id")?, r.u32("partition")?);
            debts.insert(key, r.u64("owed")?);
        }
        Ok(Self {
            retired_through,
            reports,
            debts,
        })
    }

    /// What the coordinator finalizes now, given the nodes that must have reported:
    /// through the lowest of their watermarks, with the union of their debts, once
    /// every one of them reported past what is retired.
    pub fn due(&self, nodes: impl IntoIterator<Item = u8>) -> Option<FinalizeSession> {
        let mut through = u64::MAX;
        let mut debt = Vec::new();
        for node in nodes {
            let report = self.reports.get(&node)?;
            through = through.min(report.watermark);
            debt.extend_from_slice(&report.debt);
        }
        if through == u64::MAX || through <= self.retired_through {
            return None;
        }
        debt.sort_unstable();
        debt.dedup();
        debt.truncate(DEBT_MAX);
        Some(FinalizeSession {
            retired_through: through,
            debt,
        })
    }
}

/// A node's report of a walk. A report below the node's last changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportRetirement {
    /// The reporting node.
    pub node: u8,
    /// The walk's watermark.
    pub watermark: u64,
    /// The copies the walk could not prove, in order, at most [`DEBT_MAX`].
    pub debt: Vec<PartitionRef>,
}

impl Change for ReportRetirement {
    const CODE: u8 = 14;
    fn check(&self, meta: &Metadata) -> Result<(), MetaError> {
        if self.watermark > meta.applied_op {
            return Err(MetaError::Invalid(format!(
                "a walk's watermark {} is past the metadata's op {}",
                self.watermark, meta.applied_op
            )));
        }
        if self.debt.len() > DEBT_MAX {
            return Err(MetaError::Invalid(format!(
                "a report names {} copies as debt, at most {DEBT_MAX}",
                self.debt.len()
            )));
        }
        Ok(())
    }
    fn apply(&self, meta: &mut Metadata) {
        let report = meta.retirement.reports.entry(self.node).or_default();
        if self.watermark > report.watermark {
            *report = RetireReport {
                watermark: self.watermark,
                debt: self.debt.clone(),
            };
        }
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.put_u8_be(self.node);
        out.put_u64_be(self.watermark);
        put_refs(out, &self.debt);
    }
    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        Ok(Self {
            node: r.u8("node")?,
            watermark: r.u64("watermark")?,
            debt: refs(r)?,
        })
    }
}

/// Retires every session ended at or below `retired_through`: the metadata forgets
/// them (a produce naming one is refused as unknown), and `debt`'s partitions owe the
/// retirement through it (the debts of an earlier finalize are replaced: a walk that
/// proved a partition cleared it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalizeSession {
    /// The op through which ended sessions are retired.
    pub retired_through: u64,
    /// The partitions that could not be proven, in order, at most [`DEBT_MAX`].
    pub debt: Vec<PartitionRef>,
}

impl Change for FinalizeSession {
    const CODE: u8 = 15;
    fn check(&self, meta: &Metadata) -> Result<(), MetaError> {
        if self.retired_through <= meta.retirement.retired_through
            || self.retired_through > meta.applied_op
        {
            return Err(MetaError::Invalid(format!(
                "sessions are retired through op {}; {} is not past it or is past the \
                 metadata's op {}",
                meta.retirement.retired_through, self.retired_through, meta.applied_op
            )));
        }
        if self.debt.len() > DEBT_MAX {
            return Err(MetaError::Invalid(format!(
                "a finalize names {} partitions as debt, at most {DEBT_MAX}",
                self.debt.len()
            )));
        }
        Ok(())
    }
    fn touches(&self, meta: &Metadata) -> Vec<Touch> {
        let mut touched: Vec<Touch> = meta
            .sessions
            .iter()
            .filter(|(_, s)| s.ended_at.is_some_and(|end| end <= self.retired_through))
            .map(|(id, _)| Touch::Session(*id))
            .collect();
        touched.push(Touch::Debts);
        touched
    }
    fn apply(&self, meta: &mut Metadata) {
        let through = self.retired_through;
        meta.sessions
            .retain(|_, s| s.ended_at.is_none_or(|end| end > through));
        let sessions = &meta.sessions;
        meta.session_owners
            .retain(|id, _| sessions.contains_key(id));
        let retirement = &mut meta.retirement;
        retirement.retired_through = through;
        retirement.reports.retain(|_, r| r.watermark > through);
        retirement.debts = self.debt.iter().map(|key| (*key, through)).collect();
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.put_u64_be(self.retired_through);
        put_refs(out, &self.debt);
    }
    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        Ok(Self {
            retired_through: r.u64("retired_through")?,
            debt: refs(r)?,
        })
    }
}
