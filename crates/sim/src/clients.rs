//! Simulated clients: registering, requesting, retrying, checking replies.

use braid_vsr::{Message, Refusal, ReplicaId, Reply, Request};

use super::*;

impl Simulation {
    pub(crate) fn drive_clients(&mut self) {
        const RETRY_TICKS: u64 = 60;
        for i in 0..self.clients.len() {
            let (group, id, session, pending, view_hint, done) = {
                let c = &self.clients[i];
                (
                    c.group,
                    c.id,
                    c.session,
                    c.pending.clone(),
                    c.view_hint,
                    c.done,
                )
            };
            if done {
                continue;
            }
            let (request, body, sent) = match pending {
                Some(p) => p,
                None => {
                    let c = &mut self.clients[i];
                    let (request, body) = if c.session == 0 {
                        c.registrations += 1;
                        (c.registrations, Vec::new())
                    } else {
                        c.next_request += 1;
                        c.operation += 1;
                        // Few keys, so results depend on the order of all clients' ops.
                        let body = format!("k{}={}", c.operation % 3, c.id % 7 + 1).into_bytes();
                        (c.next_request, body)
                    };
                    c.pending = Some((request, body.clone(), 0));
                    let operation = (c.id, c.operation);
                    if session != 0 {
                        if let Some(model) = self.models.get_mut(&group) {
                            model.bodies.insert((session, request), body.clone());
                            model.operations.insert((session, request), operation);
                        }
                    }
                    (request, body, 0)
                }
            };
            if sent != 0 && self.tick - sent < RETRY_TICKS {
                continue;
            }
            let message = Message::Request(Request {
                client: id,
                session,
                request,
                body: body.clone().into(),
            });
            // First to the primary it believes in; on a retry, to everyone.
            let n = u64::from(self.config.replica_count);
            let targets: Vec<ReplicaId> = if sent == 0 {
                vec![((view_hint + group) % n) as ReplicaId]
            } else {
                (0..self.config.replica_count).collect()
            };
            for to in targets {
                self.send(
                    Address::Client(id),
                    Address::Replica(group, to),
                    Payload::Replica(message.clone()),
                );
            }
            if let Some(c) = self.clients.get_mut(i) {
                c.pending = Some((request, body, self.tick));
            }
        }
    }

    pub(crate) fn on_reply(&mut self, client: u64, reply: Reply) {
        if reply.register && reply.result == Err(Refusal::RequestTooOld) {
            self.outcome.stale_registers_refused += 1;
        }
        let Some(index) = self.clients.iter().position(|c| c.id == client) else {
            return;
        };
        let c = &self.clients[index];
        let Some((request, _, _)) = c.pending.clone() else {
            return;
        };
        let group = c.group;
        let registering = c.session == 0;
        if registering != reply.register {
            return;
        }
        if registering {
            // Only the answer to this attempt: a replayed old register's reply is not it.
            if reply.request != request {
                return;
            }
        } else if reply.session != c.session || reply.request != request {
            return;
        }
        match &reply.result {
            Ok(result) if !registering => {
                let expected = self
                    .models
                    .get(&group)
                    .and_then(|m| m.results.get(&(reply.session, reply.request)))
                    .cloned();
                match expected {
                    Some(Ok(expected)) if &expected == result => {}
                    other => {
                        self.fail(format!(
                            "client {client} got {:?} for request {} of session {}, the committed log says {other:?}",
                            String::from_utf8_lossy(result),
                            reply.request,
                            reply.session
                        ));
                        return;
                    }
                }
            }
            Ok(_) => {}
            Err(Refusal::SessionUnknown) => {
                // Evicted for capacity. The rule: an earlier attempt of this request may
                // have run before the eviction (its reply lost), so its outcome is
                // unknown; the client registers again and does not resend it as new.
                let resend = self.config.resend_after_eviction;
                let c = &mut self.clients[index];
                c.session = 0;
                c.pending = None;
                c.next_request = 0;
                if resend {
                    c.operation = c.operation.saturating_sub(1);
                } else {
                    self.outcome.outcomes_unknown += 1;
                    if c.operation >= c.requests_total {
                        c.done = true;
                    }
                }
                return;
            }
            Err(Refusal::RequestTooOld) => {
                self.fail(format!(
                    "client {client} request {} refused as too old",
                    reply.request
                ));
                return;
            }
        }
        let c = &mut self.clients[index];
        c.view_hint = reply.view;
        c.pending = None;
        if registering {
            c.session = reply.session;
            // A stale register reply after eviction would name an evicted session; the
            // cluster refuses its requests, which sends the client back to register.
        } else if c.operation >= c.requests_total {
            c.done = true;
        }
    }
}
