//! The coordinator's side of client sessions: a register answered with the session's
//! id, heartbeats, and the end of sessions that went quiet (see `client_sessions`).

use std::sync::Arc;

use braid_proto::client::{ErrorCode, Response};

use super::{MetaService, Reply, Waiter};
use crate::error::NodeError;
use crate::mailbox::{now_ms, NodeShared};
use crate::metadata::{op, MetaError, MetaOp};

/// The most client sessions open at once in a cluster (ended ones wait for retirement
/// apart): a register past it is `QuotaExceeded`.
pub(crate) const CLIENT_SESSIONS_MAX: usize = 100_000;

impl MetaService {
    /// What a proposal's waiter is told, and what the coordinator learns from it: a
    /// registered session is watched from its register on, an end that failed is
    /// proposed again.
    pub(super) fn settle(
        &mut self,
        waiter: Waiter,
        outcome: Result<u64, NodeError>,
    ) -> Option<(Reply, Result<Response, NodeError>)> {
        match waiter {
            Waiter::Plain(reply) => Some((reply, outcome.map(|_| Response::Empty))),
            Waiter::Register { reply, timeout_ms } => {
                if let Ok(session) = outcome {
                    self.liveness.heard(session, timeout_ms, now_ms());
                }
                Some((reply, outcome.map(Response::Session)))
            }
            Waiter::Expiry(session) => {
                match outcome {
                    Ok(_) => {
                        tracing::info!(session, "a client session missed its heartbeats: ended")
                    }
                    Err(_) => self.liveness.end_failed(session),
                }
                None
            }
            Waiter::Join {
                reply,
                stream,
                group,
            } => {
                let answer = outcome.and_then(|member| self.joined(&stream, &group, member));
                Some((reply, answer))
            }
            Waiter::Quiet => {
                if let Err(err) = outcome {
                    tracing::debug!(%err, "a quiet member's leave was refused");
                }
                None
            }
            Waiter::Report | Waiter::Finalize => {
                match outcome {
                    Ok(_) if matches!(waiter, Waiter::Finalize) => {
                        self.finalizes_committed += 1;
                    }
                    Ok(_) => {}
                    Err(err) => tracing::debug!(%err, "a retirement op was refused"),
                }
                None
            }
        }
    }

    /// On the coordinator, proposes the end of every session that went quiet.
    pub(super) fn end_quiet_sessions(&mut self, shared: &Arc<NodeShared>, now: u64) {
        let Some(primary) = self.group.primary() else {
            return;
        };
        if primary != shared.cluster.node_id {
            return;
        }
        self.liveness.enter_view(self.group.view());
        for session in self.liveness.expired(&self.group.state().sessions, now) {
            let end = MetaOp::EndSession(op::EndSession { session });
            self.propose(shared, end, Waiter::Expiry(session));
        }
    }

    pub(super) fn register_session(
        &mut self,
        shared: &Arc<NodeShared>,
        timeout_ms: u32,
        user: Option<String>,
        reply: Reply,
    ) {
        let sessions = &self.group.state().sessions;
        if sessions.len() >= CLIENT_SESSIONS_MAX
            && sessions.values().filter(|s| s.ended_at.is_none()).count() >= CLIENT_SESSIONS_MAX
        {
            let _ = reply.send(Err(NodeError::new(
                ErrorCode::QuotaExceeded,
                format!("{CLIENT_SESSIONS_MAX} client sessions are open: end one first"),
            )));
            return;
        }
        let register = match user {
            // A logged-in user's session is its own: nobody else may use it.
            Some(user) => {
                MetaOp::RegisterOwnedSession(op::RegisterOwnedSession { timeout_ms, user })
            }
            None => MetaOp::RegisterSession(op::RegisterSession { timeout_ms }),
        };
        self.propose(shared, register, Waiter::Register { reply, timeout_ms });
    }

    /// Refuses `user` a session of another user (`client_sessions::owner_refusal`).
    pub(super) fn check_owner(&self, session: u64, user: Option<&str>) -> Result<(), NodeError> {
        let owner = self.group.state().session_owners.get(&session);
        match crate::client_sessions::owner_refusal(session, owner.map(String::as_str), user) {
            Some(refusal) => Err(refusal),
            None => Ok(()),
        }
    }

    /// A heartbeat keeps an open session; an ended, retired or unknown one is
    /// `SessionNotFound`.
    pub(super) fn session_heartbeat(&mut self, session: u64) -> Result<Response, NodeError> {
        self.liveness.enter_view(self.group.view());
        match self.group.state().sessions.get(&session) {
            Some(open) if open.ended_at.is_none() => {
                self.liveness.heard(session, open.timeout_ms, now_ms());
                Ok(Response::SessionAlive {
                    retired_through: self.group.state().retirement.retired_through,
                })
            }
            Some(_) => Err(NodeError::new(
                ErrorCode::SessionNotFound,
                format!("client session {session} has ended: register a new one"),
            )),
            None => Err(MetaError::SessionNotFound(session).into()),
        }
    }
}
