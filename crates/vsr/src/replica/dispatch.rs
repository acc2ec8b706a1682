//! Messages in: screening (who may send what, for which group, intact) and handing
//! each to its handler.

use super::*;

impl<S: StateMachine> Replica<S> {
    /// Whether a message must be dropped before any handler sees it: a sender outside
    /// the group (or posing as this replica), another group's prepare or snapshot, a
    /// damaged one, or a view-scoped message from a replica that does not lead that view.
    /// Every drop is counted. Without this a stray id would count toward a quorum.
    fn ignore_message(&mut self, message: &Message) -> bool {
        if let Some(from) = message.from() {
            if from >= self.config.replica_count || from == self.config.replica {
                self.ignored.foreign_sender += 1;
                return true;
            }
        }
        let (group, intact) = match message {
            Message::Prepare(prepare) => (prepare.header.group, prepare.valid()),
            Message::Snapshot { checkpoint, .. } => (checkpoint.header.group, checkpoint.valid()),
            Message::DoViewChange { suffix, .. } | Message::StartView { suffix, .. } => (
                suffix.first().map_or(self.config.group, |e| e.header.group),
                suffix.iter().all(|e| {
                    e.header.valid()
                        && e.header.group == self.config.group
                        && e.body
                            .as_ref()
                            .is_none_or(|b| crate::message::checksum(b) == e.header.body_checksum)
                }),
            ),
            _ => (self.config.group, true),
        };
        if group != self.config.group {
            self.ignored.wrong_group += 1;
            return true;
        }
        if !intact {
            self.ignored.damaged += 1;
            return true;
        }
        let leads = |view: u64, from: ReplicaId| self.primary_of(view) == from;
        let from_primary = match message {
            Message::Commit { view, from, .. } | Message::StartView { view, from, .. } => {
                leads(*view, *from)
            }
            _ => true,
        };
        if !from_primary {
            self.ignored.not_from_primary += 1;
            return true;
        }
        false
    }

    pub(super) fn on_message(&mut self, message: Message, out: &mut Vec<Output>) {
        if self.ignore_message(&message) {
            return;
        }
        match message {
            Message::Request(request) => self.on_request(request, out),
            Message::Prepare(prepare) => self.on_prepare(prepare, out),
            Message::PrepareOk {
                view,
                op,
                checksum,
                from,
            } => self.on_prepare_ok(view, op, checksum, from, out),
            Message::Commit {
                view,
                commit,
                checksum,
                from,
            } => self.on_commit(view, commit, checksum, from, out),
            Message::StartViewChange { view, from } => self.on_start_view_change(view, from, out),
            Message::DoViewChange {
                view,
                log_view,
                op,
                commit,
                commit_checksum,
                suffix,
                faulty,
                trusted_through,
                from,
            } => {
                let vote = ViewChangeVote {
                    log_view,
                    op,
                    commit,
                    commit_checksum,
                    suffix,
                    faulty,
                    trusted_through,
                };
                self.on_do_view_change(view, from, vote, out);
            }
            Message::StartView {
                view,
                op,
                commit,
                suffix,
                from,
            } => self.on_start_view(view, op, commit, suffix, from, out),
            Message::RequestPrepare { op, checksum, from } => {
                self.on_request_prepare(op, checksum, from, out)
            }
            Message::RequestStartView { view, from } => self.on_request_start_view(view, from, out),
            Message::Committed {
                view,
                commit,
                checksum,
                ..
            } => self.on_committed(view, commit, checksum, out),
            Message::RequestSnapshot { from } => self.on_request_snapshot(from, out),
            Message::RequestViews { from, nonce } => {
                out.push(Output::Send {
                    to: from,
                    message: Message::Views {
                        view: self.view,
                        primary_op: (self.is_primary() && self.status() == Status::Normal)
                            .then_some(self.op),
                        from: self.config.replica,
                        nonce,
                    },
                });
            }
            Message::Views {
                view,
                primary_op,
                from,
                nonce,
            } => self.on_views(view, primary_op, from, nonce, out),
            Message::Snapshot {
                checkpoint, view, ..
            } => self.on_snapshot(checkpoint, view, out),
        }
    }
}
