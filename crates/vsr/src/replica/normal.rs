//! Normal operation: prepares, acknowledgements, commits, applying committed ops in
//! order, and checkpoints.

use super::*;

impl<S: StateMachine> Replica<S> {
    /// `ignore_message` checked the prepare's checksums and group: a megabyte batch is
    /// hashed once on its way in, not twice.
    pub(super) fn on_prepare(&mut self, prepare: Prepare, out: &mut Vec<Output>) {
        debug_assert!(prepare.valid() && prepare.header.group == self.config.group);
        let header = prepare.header;
        // A repair answer: accept it where the chain expects exactly this checksum.
        let expected = self.wanted.get(&header.op).copied().or_else(|| {
            self.journal
                .get(&header.op)
                .filter(|e| e.body.is_none())
                .map(|e| e.header.checksum)
        });
        if expected == Some(header.checksum) {
            let canonical = self.journal.get(&header.op).is_some_and(|e| e.canonical)
                || self
                    .journal
                    .get(&(header.op + 1))
                    .is_some_and(|e| e.canonical && e.header.parent == header.checksum)
                || self.wanted.contains_key(&header.op);
            self.insert_entry(header, Some(prepare.body), canonical, out);
            self.propagate_canonical();
            self.apply_committed(out);
            if self.view_change().is_some_and(|v| v.start_view_pending) {
                self.try_start_view(out);
            }
            return;
        }
        // A re-sent prepare of an earlier view (the new primary re-proposes its log):
        // acknowledge it if this view's log already holds exactly it.
        if self.status() == Status::Normal && header.view < self.view && !self.is_primary() {
            let holds = self.journal.get(&header.op).is_some_and(|e| {
                e.header.checksum == header.checksum && e.canonical && e.durable && e.body.is_some()
            });
            // Even an op this replica already knows committed: the new primary may not
            // know it yet and counts acknowledgements to find out.
            if holds {
                self.send_prepare_ok(header.op, header.checksum, out);
            }
            return;
        }
        if self.status() != Status::Normal || header.view != self.view {
            if header.view > self.view {
                // A newer view exists: learn it from its primary.
                let to = self.primary_of(header.view);
                out.push(Output::Send {
                    to,
                    message: Message::RequestStartView {
                        view: header.view,
                        from: self.config.replica,
                    },
                });
            }
            return;
        }
        if self.is_primary() {
            return;
        }
        self.watching = false;
        self.arm(Timer::ViewChange, self.config.view_change_ticks * 2);
        match self.journal.get(&header.op) {
            Some(entry) if entry.header.checksum == header.checksum && entry.durable => {
                self.send_prepare_ok(header.op, header.checksum, out);
            }
            Some(entry) if entry.header.checksum == header.checksum => {}
            _ if header.op == self.op + 1 => {
                let chained = self
                    .journal
                    .get(&self.op)
                    .is_some_and(|e| e.header.checksum == header.parent);
                if chained {
                    self.insert_entry(header, Some(prepare.body), true, out);
                    self.propagate_canonical();
                } else {
                    // Our tip is not the view's: the StartView will say what is.
                    out.push(Output::Send {
                        to: self.primary_of(self.view),
                        message: Message::RequestStartView {
                            view: self.view,
                            from: self.config.replica,
                        },
                    });
                }
            }
            _ if header.op > self.op + 1 => {
                // A gap: note what the chain below this op must be and repair it.
                self.wanted.insert(header.op - 1, header.parent);
                self.repair(out);
            }
            _ => {}
        }
        self.heard_commit = self.heard_commit.max(header.commit);
        self.commit_max = self.commit_max.max(header.commit.min(self.op));
        if header.commit <= self.op {
            // The primary's commit is canonical if our chain reaches it.
            self.propagate_canonical();
        }
        self.apply_committed(out);
    }

    pub(super) fn send_prepare_ok(&self, op: u64, checksum: Checksum, out: &mut Vec<Output>) {
        if self.status() != Status::Normal || !self.view_durable() {
            return;
        }
        if !self.may_trust_in(self.view) {
            // A replica that lost its disk lost the promise its durable view made (never
            // to act in an older view): until a quorum of peers has shown it a view at
            // least as new, an acknowledgement could let a stale view's primary commit
            // over what a newer view committed (simulator seed 992014).
            return;
        }
        out.push(Output::Send {
            to: self.primary_of(self.view),
            message: Message::PrepareOk {
                view: self.view,
                op,
                checksum,
                from: self.config.replica,
            },
        });
    }

    pub(super) fn on_journal_written(
        &mut self,
        op: u64,
        checksum: Checksum,
        out: &mut Vec<Output>,
    ) {
        let Some(entry) = self.journal.get_mut(&op) else {
            return;
        };
        if entry.header.checksum != checksum {
            return;
        }
        entry.durable = true;
        let canonical = entry.canonical;
        self.trust_when_repaired(out);
        if self.status() != Status::Normal {
            if self.view_change().is_some_and(|v| v.start_view_pending) {
                self.try_start_view(out);
            }
            return;
        }
        if self.is_primary() {
            self.try_commit(out);
        } else if op > self.commit_max && canonical {
            self.send_prepare_ok(op, checksum, out);
        }
        self.apply_committed(out);
    }

    pub(super) fn on_prepare_ok(
        &mut self,
        view: u64,
        op: u64,
        checksum: Checksum,
        from: ReplicaId,
        out: &mut Vec<Output>,
    ) {
        if view == self.view
            && self.is_primary()
            && from == self.primary_of(0)
            && self
                .journal
                .get(&op)
                .is_some_and(|e| e.header.checksum == checksum)
        {
            // Late acknowledgements count here too: an op committed without the
            // preferred replica is still one it holds.
            if let Phase::Normal { preferred_acked } = &mut self.phase {
                *preferred_acked = (*preferred_acked).max(op);
            }
        }
        if self.ignore_prepare_ok(view, op, checksum) {
            return;
        }
        invariant!(
            from != self.config.replica && from < self.config.replica_count,
            "an acknowledgement from outside the group reached the handler"
        );
        self.prepare_oks.entry(op).or_default().insert(from);
        self.try_commit(out);
    }

    /// A PrepareOk counts only at the primary of its view, for an uncommitted op this
    /// primary holds with that checksum.
    fn ignore_prepare_ok(&self, view: u64, op: u64, checksum: Checksum) -> bool {
        !self.is_primary()
            || view != self.view
            || op <= self.commit_max
            || self
                .journal
                .get(&op)
                .is_none_or(|e| e.header.checksum != checksum)
    }

    /// Commits, in order, every op a quorum (the primary's own durable copy included)
    /// has in its journal.
    pub(super) fn try_commit(&mut self, out: &mut Vec<Output>) {
        if !self.view_durable() {
            return;
        }
        let before = self.commit_max;
        loop {
            let op = self.commit_max + 1;
            let Some(entry) = self.journal.get(&op) else {
                break;
            };
            let own = usize::from(entry.durable && entry.body.is_some());
            let acks = self.prepare_oks.get(&op).map_or(0, BTreeSet::len);
            if own + acks < self.config.quorum() {
                break;
            }
            self.commit_max = op;
            self.prepare_oks.if_boxed(|oks| {
                oks.remove(&op);
            });
        }
        if self.commit_max > before {
            // Progress: the step-down deadline starts again (see `settle_step_down`).
            self.deadlines.clear(Timer::ViewChange);
            self.apply_committed(out);
            self.send_commit(out);
        }
    }

    pub(super) fn send_commit(&self, out: &mut Vec<Output>) {
        if !self.view_durable() {
            return;
        }
        let Some(checksum) = self
            .journal
            .get(&self.commit_max)
            .map(|e| e.header.checksum)
        else {
            return;
        };
        self.send_to_others(
            Message::Commit {
                view: self.view,
                commit: self.commit_max,
                checksum,
                from: self.config.replica,
            },
            out,
        );
    }

    pub(super) fn on_commit(
        &mut self,
        view: u64,
        commit: u64,
        checksum: Checksum,
        from: ReplicaId,
        out: &mut Vec<Output>,
    ) {
        // A newer view, or the view this replica is still changing to while its primary
        // is normal there: its StartView never came here (lost, or sent while this
        // replica was down), so ask for it rather than wait for the next view change
        // (the shell simulator's seed 315500: a member that missed view 8's StartView
        // voted for view after view while the others committed in view 8).
        // (A recovering replica asks on its own timer, once it may: see `Rejoin`.)
        let missed_start = view == self.view
            && self.status() == Status::ViewChange
            && from == self.primary_of(view)
            && from != self.config.replica;
        if view > self.view || missed_start {
            out.push(Output::Send {
                to: from,
                message: Message::RequestStartView {
                    view,
                    from: self.config.replica,
                },
            });
            return;
        }
        if self.ignore_commit(view) {
            return;
        }
        self.watching = false;
        self.arm(Timer::ViewChange, self.config.view_change_ticks * 2);
        self.heard_commit = self.heard_commit.max(commit);
        if commit > self.commit_max {
            self.commit_max = commit;
            self.record_anchor(commit, checksum);
        }
        if commit < self.commit_max {
            // A new primary that learned less than this backup knows: tell it, or it
            // waits for acknowledgements of ops this backup may have compacted away.
            if let Some(known) = self.journal.get(&self.commit_max).filter(|e| e.canonical) {
                out.push(Output::Send {
                    to: from,
                    message: Message::Committed {
                        view: self.view,
                        commit: self.commit_max,
                        checksum: known.header.checksum,
                        from: self.config.replica,
                    },
                });
            }
        }
        self.apply_committed(out);
    }

    /// A Commit counts only at a normal backup of its view (a newer view was handled
    /// before: the backup asks for its StartView).
    fn ignore_commit(&self, view: u64) -> bool {
        view < self.view || self.status() != Status::Normal || self.is_primary()
    }

    /// A backup knows more is committed: a primary takes it where its own log holds
    /// that op with that checksum in this view's chain (every view's log holds every
    /// committed op, so this is the same op and all below it are committed too).
    pub(super) fn on_committed(
        &mut self,
        view: u64,
        commit: u64,
        checksum: Checksum,
        out: &mut Vec<Output>,
    ) {
        if !self.is_primary() || view != self.view || commit <= self.commit_max || commit > self.op
        {
            return;
        }
        let pinned = self
            .journal
            .get(&commit)
            .is_some_and(|e| e.canonical && e.header.checksum == checksum);
        if !pinned {
            return;
        }
        self.commit_max = commit;
        self.prepare_oks.if_boxed(|oks| {
            oks.retain(|op, _| *op > commit);
        });
        self.apply_committed(out);
        self.send_commit(out);
        // Ops above may already hold a quorum of acknowledgements, counted while the
        // op below them did not: they commit now, or nothing would ever ask again
        // (their backups acknowledged them, so the retry sends them to nobody).
        self.try_commit(out);
    }

    /// Applies committed canonical ops in order; stops at the first one missing.
    pub(super) fn apply_committed(&mut self, out: &mut Vec<Output>) {
        self.propagate_canonical();
        let mut applied_any = false;
        while self.commit_min < self.commit_max {
            let op = self.commit_min + 1;
            let Some(entry) = self.journal.get(&op) else {
                break;
            };
            let chained = self
                .journal
                .get(&self.commit_min)
                .is_some_and(|below| below.header.checksum == entry.header.parent);
            if !entry.canonical || !chained {
                break;
            }
            let Some(body) = entry.body.clone() else {
                break;
            };
            let header = entry.header;
            let applied =
                self.state
                    .apply(op, header.operation, header.session, header.request, &body);
            let session = match (&header.operation, &applied.result) {
                (Operation::Register, Ok(raw)) if raw.len() == 8 => {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(raw);
                    u64::from_be_bytes(b)
                }
                _ => header.session,
            };
            if let Some(evicted) = applied.evicted {
                out.push(Output::Evicted { session: evicted });
            }
            out.push(Output::Applied {
                op,
                checksum: header.checksum,
                session,
                request: header.request,
                register: header.operation == Operation::Register,
                executed: applied.executed,
                result: applied.result.clone(),
            });
            if self.is_primary() && header.operation != Operation::Root {
                let client = match header.operation {
                    Operation::Register => {
                        let mut raw = [0u8; 8];
                        raw.copy_from_slice(body.get(..8).unwrap_or(&[0; 8]));
                        u64::from_be_bytes(raw)
                    }
                    // The session's client; none (0) if it was evicted before the op
                    // applied: that client's retry is refused by the request path.
                    _ => self.state.client_of(header.session).unwrap_or(0),
                };
                out.push(Output::Reply(Reply {
                    client,
                    session,
                    request: header.request,
                    register: header.operation == Operation::Register,
                    view: self.view,
                    result: applied.result,
                }));
            }
            self.commit_min = op;
            applied_any = true;
            if op.is_multiple_of(self.config.checkpoint_interval) {
                self.take_checkpoint(out);
            }
        }
        if applied_any && self.config.compact_committed && self.commit_min > self.compacted_through
        {
            // Every applied op is on the shell's disk: keep the newest as the anchor
            // the next prepare chains to, and serve the rest from disk.
            let anchor = self.commit_min;
            self.journal.retain(|op, _| *op >= anchor);
            self.compacted_through = anchor;
        }
        if applied_any
            && self.durable.commit + self.config.checkpoint_interval / 2 <= self.commit_max
        {
            // Persist progress now and then; commit is only a hint for restarts.
            self.write_state(out);
        }
        // Applied ops need no body here: a journal waiting for bodies to be trusted
        // again may be whole now (a snapshot or a copied log caught it up).
        self.trust_when_repaired(out);
    }

    pub(super) fn take_checkpoint(&mut self, out: &mut Vec<Output>) {
        let Some(header) = self.journal.get(&self.commit_min).map(|e| e.header) else {
            return;
        };
        out.push(Output::WriteCheckpoint(Checkpoint::new(
            header,
            self.state.snapshot(),
        )));
        // Never above the previous checkpoint: it is the fallback should this one be
        // damaged, and it needs the journal above it.
        let prune = header
            .op
            .saturating_sub(self.config.journal_keep)
            .min(self.checkpoint_op);
        self.checkpoint_op = header.op;
        if prune > 0 {
            out.push(Output::PruneJournal { op: prune });
            let keep = self.journal.split_off(&prune);
            self.journal = keep;
            // The checkpoint op's header stays as the chain's anchor.
            self.journal.or_insert(header.op, Entry::anchor(header));
            self.wanted.if_boxed(|w| *w = w.split_off(&prune));
        }
    }
}
