//! Client requests at the primary: registers, retries answered from the client table,
//! refusals, and new prepares.

use super::*;

impl<S: StateMachine> Replica<S> {
    /// A normal backup with reason to doubt its primary (a client came here, or its
    /// link to the primary is gone): awake until the primary is heard from, with its
    /// view-change timer armed (a quiescence at the end of this step must not drop the
    /// timer that replaces a dead primary).
    pub(super) fn start_watching(&mut self) {
        if self.status() != Status::Normal || self.is_primary() {
            return;
        }
        self.watching = true;
        if self.deadlines.get(Timer::ViewChange).is_none() {
            let timeout = self.view_change_timeout();
            self.arm(Timer::ViewChange, timeout);
        }
    }

    pub(super) fn on_request(&mut self, request: Request, out: &mut Vec<Output>) {
        if !self.is_primary() || !self.view_durable() {
            // A client that came to a backup could not reach the primary: if this
            // replica was quiescent, it starts watching the primary again.
            if !self.is_primary() {
                self.start_watching();
            }
            return;
        }
        let reply = |result| {
            Output::Reply(Reply {
                client: request.client,
                session: request.session,
                request: request.request,
                register: false,
                view: self.view,
                result,
            })
        };
        let operation = if request.session == 0 {
            // A retry of a register already applied gets its session; an older one is
            // refused.
            if let Some(answer) = self.state.registration(request.client, request.request) {
                let session = match &answer {
                    Ok(raw) if raw.len() == 8 => {
                        let mut b = [0u8; 8];
                        b.copy_from_slice(raw);
                        u64::from_be_bytes(b)
                    }
                    _ => 0,
                };
                out.push(Output::Reply(Reply {
                    client: request.client,
                    session,
                    request: request.request,
                    register: true,
                    view: self.view,
                    result: answer,
                }));
                return;
            }
            Operation::Register
        } else {
            // Answer retries of applied requests from the table; refuse unknown sessions
            // and old request numbers.
            if let Some(cached) = self.state.cached(request.session, request.request) {
                out.push(reply(cached));
                return;
            }
            // Refused only by a primary whose state holds every committed op: all it
            // knows committed applied, and that is its whole log or reaches an op of
            // its own view (a new primary's commit point may lag ops committed in the
            // views before: refused there, a session whose register it had not applied
            // yet registered again, and its pending request applied twice).
            let state_complete = self.commit_min == self.commit_max
                && (self.commit_max == self.op
                    || self
                        .journal
                        .get(&self.commit_max)
                        .is_some_and(|e| e.header.view == self.view));
            if !self.state.has_session(request.session) && state_complete {
                out.push(reply(Err(Refusal::SessionUnknown)));
                return;
            }
            Operation::Request
        };
        // A retry of a request still in the pipeline: it will be answered at commit.
        let in_pipeline = ((self.commit_min + 1)..=self.op).any(|op| {
            self.journal.get(&op).is_some_and(|e| {
                e.header.operation == operation
                    && e.header.session == request.session
                    && e.header.request == request.request
                    && (operation != Operation::Register
                        || e.body.as_deref() == Some(&request.client.to_be_bytes()[..]))
            })
        });
        if in_pipeline || self.op - self.commit_max >= self.config.pipeline_max {
            return;
        }
        let body = match operation {
            // A register's body names the client, so its retry is recognised above.
            Operation::Register => bytes::Bytes::copy_from_slice(&request.client.to_be_bytes()),
            _ => request.body,
        };
        let Some(parent) = self.journal.get(&self.op).map(|e| e.header.checksum) else {
            return;
        };
        let header = Header {
            group: self.config.group,
            view: self.view,
            op: self.op + 1,
            commit: self.commit_max,
            parent,
            body_checksum: crate::message::checksum(&body),
            session: request.session,
            request: request.request,
            operation,
            checksum: 0,
        }
        .seal();
        self.idle_heartbeats = 0;
        self.insert_entry(header, Some(body.clone()), true, out);
        self.prepare_oks.insert(header.op, BTreeSet::new());
        self.send_to_others(Message::Prepare(Prepare { header, body }), out);
    }
}
