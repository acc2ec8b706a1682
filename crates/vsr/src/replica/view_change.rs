//! The view change: choosing the new view's log and installing it.

use std::collections::{BTreeMap, BTreeSet};

type Votes = BTreeMap<ReplicaId, ViewChangeVote>;

use super::{
    Deadlines, DurableState, Output, Phase, Replica, Status, Timer, ViewChangeState, ViewChangeVote,
};
use crate::lazy::Lazy;
use crate::message::{Checksum, Header, Message, ReplicaId, SuffixEntry};
use crate::state::StateMachine;

impl<S: StateMachine> Replica<S> {
    pub(super) fn start_view_change(&mut self, view: u64, out: &mut Vec<Output>) {
        if view <= self.view && self.status() == Status::ViewChange {
            return;
        }
        self.view = self.view.max(view);
        let mut votes = ViewChangeState::default();
        votes.start_view_change_from.insert(self.config.replica);
        self.phase = Phase::ViewChange(Box::new(votes));
        self.heard_commit = 0;
        self.idle_heartbeats = 0;
        self.prepare_oks.if_boxed(|oks| {
            oks.clear();
        });
        // Uncommitted entries may be replaced by the new view's log.
        for (op, entry) in self.journal.iter_mut() {
            if *op > self.commit_max {
                entry.canonical = false;
            }
        }
        let commit = self.commit_max;
        self.wanted.if_boxed(|w| {
            w.retain(|op, _| *op <= commit);
        });
        self.deadlines = Deadlines::NONE;
        self.watching = false;
        let timeout = self.view_change_timeout();
        self.arm(Timer::ViewChange, timeout);
        self.arm(Timer::Retry, self.config.retry_ticks);
        // The new view is written before any message of it is sent: the vote goes out
        // when the write completes (or now, if the view is already durable).
        self.write_state(out);
        self.send_start_view_change(out);
        self.maybe_send_do_view_change(out);
    }

    /// [`Input::HandOff`]: a primary with nothing in flight whose preferred replica
    /// acknowledged its newest op moves the group to the next view that replica leads.
    /// A view change like any other (a backup that times out starts the same), so it
    /// keeps every committed op; it costs the group one election.
    pub(super) fn hand_off(&mut self, out: &mut Vec<Output>) {
        if !self.may_hand_off() {
            return;
        }
        let preferred = self.primary_of(0);
        let mut view = self.view + 1;
        while self.primary_of(view) != preferred {
            view += 1;
        }
        self.start_view_change(view, out);
    }

    /// Votes for the current view change, once the view is durable.
    pub(super) fn send_start_view_change(&self, out: &mut Vec<Output>) {
        if self.status() == Status::ViewChange && self.durable.view == self.view {
            let message = Message::StartViewChange {
                view: self.view,
                from: self.config.replica,
            };
            self.send_to_others(message, out);
        }
    }

    pub(super) fn on_start_view_change(
        &mut self,
        view: u64,
        from: ReplicaId,
        out: &mut Vec<Output>,
    ) {
        if self.ignore_start_view_change(view) {
            return;
        }
        if view > self.view {
            self.start_view_change(view, out);
        }
        if let Some(votes) = self.view_change_mut() {
            votes.start_view_change_from.insert(from);
        }
        self.maybe_send_do_view_change(out);
    }

    /// A StartViewChange for an older view, or for the view this replica is normal in,
    /// changes nothing.
    fn ignore_start_view_change(&self, view: u64) -> bool {
        view < self.view || (view == self.view && self.status() == Status::Normal)
    }

    /// A StartView counts only from the primary of its view, for a view newer than this
    /// replica's or the one it is still changing to, and only with a log that reaches
    /// what this replica has applied: one whose log ends below that is an old copy (a
    /// view's log only grows, and holds every op committed before it), and installing
    /// it cut the journal under the applied op (the simulator's seed 2542488: a
    /// replica restarted from its checkpoint at op 512 took a delayed StartView of its
    /// own view at op 505 and broke the anchor invariant).
    fn ignore_start_view(&self, view: u64, op: u64, from: ReplicaId) -> bool {
        view < self.view
            || from != self.primary_of(view)
            || from == self.config.replica
            || (view == self.view && self.status() == Status::Normal)
            || op < self.commit_min
    }

    /// A DoViewChange counts only at the primary of its view, for a view not older
    /// than this replica's.
    fn ignore_do_view_change(&self, view: u64) -> bool {
        view < self.view || self.primary_of(view) != self.config.replica
    }

    /// The view change's votes, while one runs.
    pub(super) fn view_change_mut(&mut self) -> Option<&mut ViewChangeState> {
        match &mut self.phase {
            Phase::ViewChange(votes) => Some(votes),
            _ => None,
        }
    }

    /// The view change's votes, while one runs.
    pub(super) fn view_change(&self) -> Option<&ViewChangeState> {
        match &self.phase {
            Phase::ViewChange(votes) => Some(votes),
            _ => None,
        }
    }

    pub(super) fn maybe_send_do_view_change(&mut self, out: &mut Vec<Output>) {
        let quorum = self.config.quorum();
        let durable = self.durable.view == self.view;
        let Some(votes) = self.view_change_mut() else {
            return;
        };
        if !votes.do_view_change_sent && votes.start_view_change_from.len() >= quorum && durable {
            votes.do_view_change_sent = true;
            self.send_do_view_change(out);
        }
    }

    /// The journal from the commit anchor up: headers, bodies where intact.
    pub(super) fn suffix_from(
        &self,
        from: u64,
        bodies_above: u64,
        canonical_only: bool,
    ) -> Vec<SuffixEntry> {
        self.journal
            .range(from..)
            .filter(|(_, e)| e.canonical || !canonical_only)
            .map(|(op, e)| SuffixEntry {
                header: e.header,
                body: if *op > bodies_above {
                    e.body.clone()
                } else {
                    None
                },
            })
            .collect()
    }

    pub(super) fn send_do_view_change(&mut self, out: &mut Vec<Output>) {
        if self.durable.view != self.view {
            return;
        }
        if self.views_lost() {
            // It lost its disk: not even the log view its vote would name is its own,
            // so counted, its vote could make a quorum that lacks what it acknowledged
            // before. It abstains until it is normal in a newer view. (A journal
            // untrusted from op 0 alone still votes: its log view is kept, so it says
            // which views' ops it never acknowledged: seed 5743 of the shell
            // simulator, where the one replica that could say so abstained and the
            // view change waited for ever.)
            return;
        }
        let anchor = self
            .journal
            .range(..=self.commit_max)
            .next_back()
            .map_or(self.checkpoint_op, |(op, _)| *op);
        let vote = ViewChangeVote {
            log_view: self.durable.log_view,
            op: self.op,
            commit: self.commit_max,
            commit_checksum: self
                .journal
                .get(&self.commit_max)
                .filter(|e| e.canonical)
                .map(|e| e.header.checksum),
            suffix: self.suffix_from(anchor, anchor, false),
            faulty: self.faulty_in_vote(anchor),
            trusted_through: self.trusted_through,
        };
        let primary = self.primary_of(self.view);
        if primary == self.config.replica {
            self.on_do_view_change(self.view, self.config.replica, vote, out);
        } else {
            out.push(Output::Send {
                to: primary,
                message: Message::DoViewChange {
                    view: self.view,
                    log_view: vote.log_view,
                    op: vote.op,
                    commit: vote.commit,
                    commit_checksum: vote.commit_checksum,
                    suffix: vote.suffix,
                    faulty: vote.faulty,
                    trusted_through: vote.trusted_through,
                    from: self.config.replica,
                },
            });
        }
    }

    /// The ops above `anchor` a vote lists as faulty: damaged slots, and headers held
    /// alone in slots that were damaged (perhaps acknowledged before: never nacks).
    pub(super) fn faulty_in_vote(&self, anchor: u64) -> Vec<u64> {
        let mut faulty: BTreeSet<u64> = self.faulty.range((anchor + 1)..).copied().collect();
        faulty.extend(
            self.journal
                .range((anchor + 1)..)
                .filter(|(_, e)| e.after_damage && e.body.is_none())
                .map(|(op, _)| *op),
        );
        faulty.into_iter().collect()
    }

    pub(super) fn on_do_view_change(
        &mut self,
        view: u64,
        from: ReplicaId,
        vote: ViewChangeVote,
        out: &mut Vec<Output>,
    ) {
        if self.ignore_do_view_change(view) {
            return;
        }
        // A restarted replica may take part in the change to the view it was moving to
        // (it never led it: its log view is older), never re-run the change of a view
        // it led: it left that view on restart.
        if view > self.view || (self.status() == Status::Recovering && self.log_view < view) {
            self.start_view_change(view, out);
        }
        if self.status() != Status::ViewChange || view != self.view {
            return;
        }
        let quorum = self.config.quorum();
        let me = self.config.replica;
        let Some(votes) = self.view_change_mut() else {
            return;
        };
        votes.do_view_change_from.insert(from, vote);
        if !votes.do_view_change_sent {
            // A DoViewChange is as good as a StartViewChange for counting.
            votes.start_view_change_from.insert(from);
            self.maybe_send_do_view_change(out);
        }
        let Some(votes) = self.view_change_mut() else {
            return;
        };
        if votes.do_view_change_from.len() >= quorum
            && votes.do_view_change_from.contains_key(&me)
            && !votes.start_view_pending
        {
            votes.start_view_pending = true;
            // The votes are read while the journal changes: take them out meanwhile.
            let collected = std::mem::take(&mut votes.do_view_change_from);
            let adopted = self.adopt_canonical_log(&collected, out);
            if let Some(votes) = self.view_change_mut() {
                votes.do_view_change_from = collected;
                votes.start_view_pending = adopted;
            }
            self.try_start_view(out);
        }
    }
    /// Whether `vote` says it never had `op` (with `checksum`, if one is named): the op
    /// is above its log, or inside its suffix range with another checksum, or absent
    /// there and not one of its damaged slots, or held above its commit as a header
    /// alone. A damaged entry is never a nack: the sender may have acknowledged it
    /// before the damage. A header alone is one whose body this replica never wrote
    /// (taken from a view's log, or the header of a prepare that waited for its
    /// parent), so it never acknowledged the op: bodies leave memory only once
    /// applied, and a journal reports a body it wrote and lost as damaged. Where it
    /// cannot tell (a tail cut at open, which may have held a later record of the op
    /// that damage at rest destroyed), it restarts untrusted above its commit, and
    /// `trusted_through` keeps its votes from nacking there. (Without this rule, an op
    /// whose prepare reached no disk but whose header every replica held could never
    /// be dropped, and no view could start: the shell simulator's seeds 39 and 114.
    /// Without the untrusted restart, it dropped an acknowledged op: seed 825.)
    pub(super) fn nacks_op(vote: &ViewChangeVote, op: u64, checksum: Option<Checksum>) -> bool {
        if op > vote.trusted_through {
            return false; // it may have had it and lost it
        }
        if vote.op < op {
            return true;
        }
        let anchor = vote.suffix.first().map_or(vote.commit, |e| e.header.op);
        match vote.suffix.iter().find(|e| e.header.op == op) {
            Some(e) => {
                checksum.is_some_and(|c| c != e.header.checksum)
                    || (e.body.is_none() && op > vote.commit && !vote.faulty.contains(&op))
            }
            None => op > anchor && !vote.faulty.contains(&op),
        }
    }

    /// Votes that never acknowledged the prepare of `header`: those that say they never
    /// had it, and those whose log view is older than the view it was prepared in. A
    /// replica acknowledges a prepare only while normal in its view, with that log view
    /// on disk, and a log view never goes back (a replica that lost its disk abstains),
    /// so an older log view is a "never had it" even from an untrusted journal, whose
    /// slot may hold an older entry or nothing (seed 5743 of the shell simulator).
    fn never_acked_count(votes: &Votes, header: &Header) -> usize {
        votes
            .values()
            .filter(|v| {
                v.log_view < header.view || Self::nacks_op(v, header.op, Some(header.checksum))
            })
            .count()
    }

    /// Votes that say they never had `op` (with `checksum`, if named) as part of the log
    /// of `best`'s log view. When `best` (trusted, of the highest log view) has no entry
    /// at `op` either, the op was not in that view's starting log (which `best` holds, as
    /// headers at least: the check above a new log's top assumes the same), so it was
    /// prepared in that view, and a vote of an older log view was never normal there to
    /// acknowledge it: those count too. Asked for the top (seed 1246066) and for a hole
    /// in the chain below it, whose checksum the op above names: counting older log
    /// views only for ops some vote names, a view whose one trusted voter held the newest
    /// ops of its log view as scattered headers could never drop the holes between them
    /// while the other voters were untrusted, one of an older log view (the shell
    /// simulator's seed 315500 with misdirected, latent and sleeping-file damage at four
    /// times the faults never started a view again).
    fn nack_count_in(
        votes: &Votes,
        best: &ViewChangeVote,
        op: u64,
        checksum: Option<Checksum>,
    ) -> usize {
        let prepared_in_best_view = Self::nacks_op(best, op, None);
        votes
            .values()
            .filter(|v| {
                (prepared_in_best_view && v.log_view < best.log_view)
                    || Self::nacks_op(v, op, checksum)
            })
            .count()
    }

    /// The new primary builds its log from the DoViewChanges: the top is the highest op
    /// of the best (log view, op) vote, and every op below is the header whose checksum
    /// the op above names as parent. Stale entries in any vote simply do not match the
    /// chain. An uncommitted op that no vote can supply is dropped, with everything
    /// above it, only on a quorum of nacks (a damaged entry is never a nack); otherwise
    /// this view cannot start until a vote or a repair supplies it.
    /// Returns whether a log was adopted (else this view waits for more votes).
    pub(super) fn adopt_canonical_log(&mut self, votes: &Votes, out: &mut Vec<Output>) -> bool {
        // The log comes from trusted votes. An untrusted journal may have lost entries
        // or reverted replacements of its log view, so it never names the top, however
        // little it holds now: a journal lost whole holds nothing above the op it trusts
        // through, and counted as trusted "through its top" it named its log view's log
        // empty (the shell simulator's seed 11305 with damage at four times the faults:
        // the one member of the newest log view had lost its `vsr.journal`, and the
        // committed ops 1 to 7 were dropped). A quorum of trusted votes is a view-change
        // quorum on its own: its best log holds every committed op. Short of that, if
        // only untrusted votes reach the highest log view, what that view committed may
        // be only there: wait for more votes.
        let trusted = |v: &&ViewChangeVote| v.trusted_through == u64::MAX;
        let trusted_quorum = votes.values().filter(trusted).count() >= self.config.quorum();
        let log_view_max = votes.values().map(|v| v.log_view).max();
        let Some(best) = votes
            .values()
            .filter(trusted)
            .max_by_key(|v| (v.log_view, v.op))
            .cloned()
        else {
            return false;
        };
        if !trusted_quorum && log_view_max != Some(best.log_view) {
            return false;
        }
        let commit = votes
            .values()
            .map(|v| v.commit)
            .max()
            .unwrap_or(0)
            .max(self.commit_max);
        // Every header any vote (or this journal) offers, by checksum, with a body if any.
        let mut pool: BTreeMap<Checksum, (Header, Option<bytes::Bytes>)> = BTreeMap::new();
        let offered = votes
            .values()
            .flat_map(|v| v.suffix.iter().map(|e| (e.header, e.body.clone())))
            .chain(self.journal.values().map(|e| (e.header, e.body.clone())));
        for (header, body) in offered {
            let slot = pool.entry(header.checksum).or_insert((header, None));
            if slot.1.is_none() {
                slot.1 = body;
            }
        }
        // The top: the highest op of the best log a same-view vote can name.
        // Entries that speak for the log of `best.log_view`: any entry of a trusted vote
        // of that log view, and of any other vote only entries prepared in that very
        // view (an op number is prepared once per view, and a view's log never loses
        // an entry while the view lasts; an older entry may be a lost replacement). A
        // vote of an older log view holds such an entry as a header alone when it took
        // the prepare before the view's log (the shell simulator's seed 2739 with
        // damage at four times the faults: the one member of that log view had lost
        // the op as damaged, and only a member of the older log view could name it; no
        // view change could start until it spoke).
        let log_view = best.log_view;
        let speaks = |v: &ViewChangeVote, e: &SuffixEntry| {
            (v.log_view == log_view && trusted(&v)) || e.header.view == log_view
        };
        let top_offered = votes
            .values()
            .flat_map(|v| v.suffix.iter().filter(move |e| speaks(v, e)))
            .map(|e| e.header.op)
            .max();
        // The committed op at `commit`, if a vote knows it: every log has it, so it can
        // be the top when the best log view's votes are shorter.
        let committed_top = votes
            .values()
            .filter(|v| v.commit == commit)
            .filter_map(|v| v.commit_checksum)
            .find_map(|checksum| pool.get(&checksum).map(|(header, _)| *header))
            .filter(|header| header.op == commit);
        let mut limit = best
            .op
            .max(top_offered.unwrap_or(0))
            .max(committed_top.map_or(0, |h| h.op));
        let (top, mut canonical, hole) = loop {
            let mut top = None;
            let mut op = limit;
            while op > self.floor() {
                let header = votes.values().find_map(|v| {
                    v.suffix
                        .iter()
                        .find(|e| e.header.op == op && speaks(v, e))
                        .map(|e| e.header)
                });
                if let Some(header) = header.or(committed_top.filter(|h| h.op == op)) {
                    top = Some(header);
                    break;
                }
                if op <= commit
                    || Self::nack_count_in(votes, &best, op, None) < self.config.quorum()
                {
                    // Unknown, and perhaps committed: this view cannot start.
                    return false;
                }
                op -= 1;
            }
            // Nothing above the checkpoint anywhere: the log is the checkpoint.
            let top = top.or_else(|| self.journal.get(&self.floor()).map(|e| e.header));
            let Some(top) = top else {
                return false;
            };
            // Walk the chain down.
            let mut canonical: BTreeMap<u64, (Header, Option<bytes::Bytes>)> = BTreeMap::new();
            let mut expected = top.checksum;
            let mut op = top.op;
            let mut hole = None;
            while op > self.floor() {
                let Some((header, body)) = pool.get(&expected).cloned() else {
                    hole = Some((op, expected));
                    break;
                };
                if header.op != op {
                    break;
                }
                expected = header.parent;
                canonical.insert(op, (header, body));
                op -= 1;
                // Below the commit, this journal's own verified chain takes over.
                if op <= commit
                    && self
                        .journal
                        .get(&op)
                        .is_some_and(|e| e.header.checksum == expected && e.canonical)
                {
                    break;
                }
            }
            match hole {
                // An uncommitted op nobody offers, which a quorum never had: it never
                // committed, so neither did anything above it. Look below it.
                Some((op, checksum))
                    if op > commit
                        && Self::nack_count_in(votes, &best, op, Some(checksum))
                            >= self.config.quorum() =>
                {
                    limit = op - 1;
                }
                Some((op, checksum)) => {
                    self.wanted.insert(op, checksum);
                    break (top, canonical, Some(op));
                }
                None => break (top, canonical, None),
            }
        };
        // Uncommitted ops nobody can supply and a quorum never had: drop them and all above.
        let droppable = canonical.iter().find(|(op, (header, body))| {
            **op > commit
                && body.is_none()
                && Self::never_acked_count(votes, header) >= self.config.quorum()
        });
        let dropped_from = droppable.map(|(&first, _)| first);
        if let Some(first) = dropped_from {
            canonical.retain(|o, _| *o < first);
        }
        // The log's top: the highest op kept, or (every op above the commit dropped)
        // the op below the first dropped, never one just dropped.
        let op = canonical
            .keys()
            .next_back()
            .copied()
            .unwrap_or_else(|| dropped_from.map_or(top.op.min(self.op), |first| first - 1));
        if op < commit {
            // The log found does not reach what is known committed: this view cannot
            // start from these votes.
            return false;
        }
        if hole == Some(op) {
            // The top left is an op no vote offers, known only by the checksum the
            // dropped op above named: no header of it could be written, so the view's
            // log would end at an op nobody here can name once this memory is gone.
            // Voters of that log view that restart could then never agree on its top
            // again (the shell simulator's seed 24236 with damage at rest: view 18
            // started that way; its two members restarted with log view 18, neither
            // could name op 125, and the view change never ended). Wait for a vote
            // that holds it.
            return false;
        }
        // The op above the new log must be one a quorum never acknowledged, or it may
        // have committed. Everything committed before view `best.log_view` started is in
        // that view's log, below `op`; so an op above could only have committed in that
        // view, acknowledged by replicas normal in it. A vote of an older log view never
        // was (its log view is durable even when its journal is not); a vote of that log
        // view says so only if its journal is trusted that high.
        let never_acked = votes
            .values()
            .filter(|v| v.log_view < best.log_view || Self::nacks_op(v, op + 1, None))
            .count();
        if never_acked < self.config.quorum() {
            return false;
        }
        if self.op > op || self.faulty.iter().any(|f| *f > op) {
            out.push(Output::TruncateJournal { op });
        }
        self.journal.retain(|o, _| *o <= op);
        self.faulty.if_boxed(|f| {
            f.retain(|f| *f <= op);
        });
        self.wanted.if_boxed(|w| {
            w.retain(|o, _| *o <= op);
        });
        self.op = op;
        for (o, (header, body)) in canonical {
            if o <= self.commit_min {
                self.check_applied(&header);
                continue;
            }
            let same = self.journal.get(&o).is_some_and(|e| {
                e.header.checksum == header.checksum && (e.body.is_some() || body.is_none())
            });
            if same {
                if let Some(e) = self.journal.get_mut(&o) {
                    e.canonical = true;
                }
            } else {
                self.insert_entry(header, body, true, out);
            }
        }
        self.commit_max = commit;
        self.propagate_canonical();
        // The StartView carries headers from the lowest anchor among the votes, so every
        // voter can link the new log to its own.
        self.start_view_anchor = votes
            .values()
            .map(|v| v.suffix.first().map_or(v.commit, |e| e.header.op))
            .min()
            .unwrap_or(self.commit_max)
            .min(self.commit_max);
        true
    }

    /// Starts the view once every uncommitted op of the adopted log is durable here.
    pub(super) fn try_start_view(&mut self, out: &mut Vec<Output>) {
        if !self.view_change().is_some_and(|v| v.start_view_pending) {
            return;
        }
        // Every uncommitted op of the adopted log: present, proven by the chain, whole
        // and durable here. A slot still holding another view's entry is not it.
        let incomplete = ((self.commit_max + 1)..=self.op).any(|op| {
            self.journal
                .get(&op)
                .is_none_or(|e| e.body.is_none() || !e.durable || !e.canonical)
        });
        if incomplete {
            self.repair_view_change(out);
            return;
        }
        self.phase = Phase::Normal { preferred_acked: 0 };
        self.log_view = self.view;
        // Its journal is now this view's log, built from trusted votes.
        if self.may_trust_in(self.view) {
            self.trust_again();
        }
        self.start_view_sent = false;
        self.prepare_oks = Lazy::from(
            ((self.commit_max + 1)..=self.op)
                .map(|op| (op, BTreeSet::new()))
                .collect::<BTreeMap<_, _>>(),
        );
        self.arm_status_timers();
        self.write_state(out);
        if self.view_durable() {
            self.send_start_view(out);
        }
        self.apply_committed(out);
    }

    pub(super) fn repair_view_change(&mut self, out: &mut Vec<Output>) {
        let missing: Vec<(u64, Checksum)> = ((self.commit_max + 1)..=self.op)
            .filter_map(|op| {
                if let Some(checksum) = self.wanted.get(&op) {
                    return Some((op, *checksum));
                }
                let e = self.journal.get(&op)?;
                (e.body.is_none() && e.canonical).then_some((op, e.header.checksum))
            })
            .collect();
        for (op, checksum) in missing {
            self.request_prepare(op, checksum, out);
        }
    }

    pub(super) fn start_view_message(&self) -> Message {
        let anchor = self.start_view_anchor.min(self.commit_max);
        let from = self
            .journal
            .range(..=anchor)
            .next_back()
            .map_or(self.checkpoint_op, |(op, _)| *op);
        Message::StartView {
            view: self.view,
            op: self.op,
            commit: self.commit_max,
            suffix: self.suffix_from(from, self.commit_max, true),
            from: self.config.replica,
        }
    }

    pub(super) fn send_start_view(&mut self, out: &mut Vec<Output>) {
        self.start_view_sent = true;
        let message = self.start_view_message();
        self.send_to_others(message, out);
        self.send_commit(out);
    }

    pub(super) fn on_start_view(
        &mut self,
        view: u64,
        op: u64,
        commit: u64,
        suffix: Vec<SuffixEntry>,
        from: ReplicaId,
        out: &mut Vec<Output>,
    ) {
        if self.ignore_start_view(view, op, from) {
            return;
        }
        self.view = view;
        self.phase = Phase::Normal { preferred_acked: 0 };
        // A newer view's log replaces whatever an untrusted journal lost: trusted
        // again once its bodies are here (below, after the log is installed). A
        // replica that lost its disk trusts the log of any view its quorum's answers
        // allow, newer than its own or not: its own log view is what the loss left
        // (0), and the StartView it asks for once they answer may name the view it is
        // in (kept to `view > log_view`, it stayed untrusted for ever in a group that
        // never changed view: an outside review of issue 24).
        let newer = view > self.log_view || self.views_lost();
        let regains_trust = (newer && self.may_trust_in(view)).then_some(self.trusted_through);
        if regains_trust.is_some() {
            self.rejoin = None;
        }
        self.log_view = view;
        self.prepare_oks.if_boxed(|oks| {
            oks.clear();
        });
        if self.op > op || self.faulty.iter().any(|f| *f > op) {
            out.push(Output::TruncateJournal { op });
        }
        self.journal.retain(|o, _| *o <= op);
        self.faulty.if_boxed(|f| {
            f.retain(|f| *f <= op);
        });
        self.wanted.if_boxed(|w| {
            w.retain(|o, _| *o <= op);
        });
        for (o, entry) in self.journal.iter_mut() {
            if *o > self.commit_max {
                entry.canonical = false;
            }
        }
        let commit_before = self.commit_max;
        self.wanted.if_boxed(|w| {
            w.retain(|o, _| *o <= commit_before);
        });
        for entry in suffix {
            if entry.header.op <= self.commit_min {
                // Applied here already: on disk (or in a checkpoint), maybe compacted out
                // of memory. Rewriting it as a header would destroy a committed body.
                self.check_applied(&entry.header);
                continue;
            }
            let same = self
                .journal
                .get(&entry.header.op)
                .is_some_and(|e| e.header.checksum == entry.header.checksum);
            if same {
                if let Some(e) = self.journal.get_mut(&entry.header.op) {
                    e.canonical = true;
                    if e.body.is_none() && entry.body.is_some() {
                        let header = e.header;
                        self.insert_entry(header, entry.body, true, out);
                    }
                }
            } else {
                self.insert_entry(entry.header, entry.body, true, out);
            }
        }
        self.op = op
            .max(self.journal.keys().next_back().copied().unwrap_or(0))
            .min(op);
        self.commit_max = self.commit_max.max(commit.min(op));
        self.heard_commit = commit;
        if let Some(untrusted_above) = regains_trust {
            self.trust_once_whole(untrusted_above);
        }
        self.arm_status_timers();
        self.write_state(out);
        self.acks_owed = true;
        self.send_owed_acks(out);
        self.apply_committed(out);
        self.repair(out);
    }

    pub(super) fn send_owed_acks(&mut self, out: &mut Vec<Output>) {
        if !self.acks_owed
            || self.status() != Status::Normal
            || !self.view_durable()
            || self.is_primary()
        {
            return;
        }
        self.acks_owed = false;
        let owed: Vec<(u64, Checksum)> = self
            .journal
            .range((self.commit_max + 1)..)
            .filter(|(_, e)| e.durable && e.canonical && e.body.is_some())
            .map(|(op, e)| (*op, e.header.checksum))
            .collect();
        for (op, checksum) in owed {
            self.send_prepare_ok(op, checksum, out);
        }
    }

    pub(super) fn on_state_written(&mut self, state: DurableState, out: &mut Vec<Output>) {
        self.durable = state;
        match self.status() {
            Status::ViewChange => {
                self.send_start_view_change(out);
                self.maybe_send_do_view_change(out);
            }
            Status::Normal if self.is_primary() => {
                if !self.start_view_sent
                    && self.view_durable()
                    && self.log_view == self.view
                    && self.view > 0
                {
                    self.send_start_view(out);
                }
                self.try_commit(out);
            }
            Status::Normal => self.send_owed_acks(out),
            Status::Recovering => {}
        }
    }

    pub(super) fn on_request_start_view(
        &mut self,
        view: u64,
        from: ReplicaId,
        out: &mut Vec<Output>,
    ) {
        if self.is_primary()
            && self.view >= view
            && self.view_durable()
            && from != self.config.replica
        {
            let message = self.start_view_message();
            out.push(Output::Send { to: from, message });
        }
    }

    /// A view's entry at an op this replica applied must be the one it applied.
    fn check_applied(&mut self, header: &Header) {
        if let Some(entry) = self.journal.get_mut(&header.op) {
            invariant!(
                entry.header.checksum == header.checksum,
                "group {} replica {}: the view's op {} is not the one applied here",
                self.config.group,
                self.config.replica,
                header.op
            );
            entry.canonical = true;
        }
    }
}
