//! Client sessions in the metadata: a client registers one (its id is the metadata op
//! that registered it, so ids only grow and are never reused), numbers its produce
//! requests under it, and ends it; the metadata keeps every session until it is
//! retired (the partitions have forgotten it), open or ended at an op.

use std::collections::BTreeMap;

use braid_proto::wire::{WireError, WireReader, WireWrite};

use super::op::Change;
use super::{MetaError, Metadata, Touch};

/// The shortest heartbeat timeout a session may ask for.
pub const SESSION_TIMEOUT_MIN_MS: u32 = 1_000;
/// The longest heartbeat timeout a session may ask for.
pub const SESSION_TIMEOUT_MAX_MS: u32 = 600_000;

/// One client session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSession {
    /// It ends when no heartbeat came for this long.
    pub timeout_ms: u32,
    /// The op that ended it, if one did.
    pub ended_at: Option<u64>,
}

/// Appends the sessions section of the metadata snapshot: `op: u64` (the op last
/// applied), `count: u32`, then `session: u64, timeout_ms: u32, ended_at: u64` (0 while
/// open) for each, in id order.
pub(super) fn encode(op: u64, sessions: &BTreeMap<u64, ClientSession>, out: &mut Vec<u8>) {
    out.put_u64_be(op);
    out.put_u32_be(sessions.len() as u32);
    for (id, session) in sessions {
        out.put_u64_be(*id);
        out.put_u32_be(session.timeout_ms);
        out.put_u64_be(session.ended_at.unwrap_or(0));
    }
}

/// Reads what [`encode`] wrote.
pub(super) fn decode(
    r: &mut WireReader<'_>,
) -> Result<(u64, BTreeMap<u64, ClientSession>), WireError> {
    let op = r.u64("applied_op")?;
    let mut sessions = BTreeMap::new();
    for _ in 0..r.count("sessions", 20)? {
        let at = r.position();
        let id = r.u64("session")?;
        let timeout_ms = r.u32("timeout_ms")?;
        let ended_at = r.u64("ended_at")?;
        if id == 0 || id > op || ended_at > op || (ended_at != 0 && ended_at < id) {
            return Err(WireError::BadValue {
                at,
                field: "session",
                value: id,
            });
        }
        let ended_at = (ended_at != 0).then_some(ended_at);
        sessions.insert(
            id,
            ClientSession {
                timeout_ms,
                ended_at,
            },
        );
    }
    Ok((op, sessions))
}

/// Open a client session; its id is this op's number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisterSession {
    /// It ends when no heartbeat comes for this long.
    pub timeout_ms: u32,
}

impl RegisterSession {
    fn check_register(&self, meta: &Metadata) -> Result<(), MetaError> {
        if !(SESSION_TIMEOUT_MIN_MS..=SESSION_TIMEOUT_MAX_MS).contains(&self.timeout_ms) {
            return Err(MetaError::Invalid(format!(
                "a session's timeout is {SESSION_TIMEOUT_MIN_MS} to {SESSION_TIMEOUT_MAX_MS} \
                 ms, not {}",
                self.timeout_ms
            )));
        }
        if meta.sessions.contains_key(&meta.applied_op) {
            // Its id is the op's number: one register per op (the node's metadata
            // client never batches two).
            return Err(MetaError::Invalid(format!(
                "op {} registered a session already",
                meta.applied_op
            )));
        }
        Ok(())
    }

    fn apply_register(&self, meta: &mut Metadata) {
        meta.sessions.insert(
            meta.applied_op,
            ClientSession {
                timeout_ms: self.timeout_ms,
                ended_at: None,
            },
        );
    }
}

impl Change for RegisterSession {
    const CODE: u8 = 12;
    const NUMBERED: bool = true;
    fn check(&self, meta: &Metadata) -> Result<(), MetaError> {
        self.check_register(meta)
    }
    fn touches(&self, meta: &Metadata) -> Vec<Touch> {
        vec![Touch::Session(meta.applied_op)]
    }
    fn apply(&self, meta: &mut Metadata) {
        self.apply_register(meta);
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.put_u32_be(self.timeout_ms);
    }
    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        Ok(Self {
            timeout_ms: r.u32("timeout_ms")?,
        })
    }
}

/// Open a client session that belongs to `user` (a client logged in): only that
/// user may produce under it, heartbeat it, end it or join a group with it. Its id is
/// this op's number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisterOwnedSession {
    /// It ends when no heartbeat comes for this long.
    pub timeout_ms: u32,
    /// The user it belongs to.
    pub user: String,
}

impl RegisterOwnedSession {
    fn register(&self) -> RegisterSession {
        RegisterSession {
            timeout_ms: self.timeout_ms,
        }
    }
}

impl Change for RegisterOwnedSession {
    const CODE: u8 = 18;
    const NUMBERED: bool = true;
    fn check(&self, meta: &Metadata) -> Result<(), MetaError> {
        self.register().check_register(meta)?;
        meta.user(&self.user).map(|_| ())
    }
    fn touches(&self, meta: &Metadata) -> Vec<Touch> {
        vec![Touch::Session(meta.applied_op)]
    }
    fn apply(&self, meta: &mut Metadata) {
        self.register().apply_register(meta);
        meta.session_owners
            .insert(meta.applied_op, self.user.clone());
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.put_u32_be(self.timeout_ms);
        out.put_string(&self.user);
    }
    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        Ok(Self {
            timeout_ms: r.u32("timeout_ms")?,
            user: r.string("user")?.to_owned(),
        })
    }
}

/// Ends every open session `user` owns (the user was deleted), with their groups'
/// members.
pub(super) fn end_owned_by(meta: &mut Metadata, user: &str) {
    let op = meta.applied_op;
    let owned: Vec<u64> = meta
        .session_owners
        .iter()
        .filter(|(_, owner)| *owner == user)
        .map(|(session, _)| *session)
        .collect();
    for session in owned {
        if let Some(open) = meta.sessions.get_mut(&session) {
            open.ended_at.get_or_insert(op);
        }
        super::members::end_session(meta, session);
    }
}

/// Appends the session owners' section of the snapshot: `count: u32`, then `session:
/// u64, user: string` for each owned session, in id order.
pub(super) fn encode_owners(owners: &BTreeMap<u64, String>, out: &mut Vec<u8>) {
    out.put_u32_be(owners.len() as u32);
    for (session, user) in owners {
        out.put_u64_be(*session);
        out.put_string(user);
    }
}

/// Reads what [`encode_owners`] wrote.
pub(super) fn decode_owners(r: &mut WireReader<'_>) -> Result<BTreeMap<u64, String>, WireError> {
    let mut owners = BTreeMap::new();
    for _ in 0..r.count("session owners", 10)? {
        owners.insert(r.u64("session")?, r.string("user")?.to_owned());
    }
    Ok(owners)
}

/// End a client session: its client closed it, or it missed its heartbeats. Ending
/// an ended session changes nothing (a retried end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndSession {
    /// The session.
    pub session: u64,
}

impl Change for EndSession {
    const CODE: u8 = 13;
    fn check(&self, meta: &Metadata) -> Result<(), MetaError> {
        if meta.sessions.contains_key(&self.session) {
            Ok(())
        } else {
            Err(MetaError::SessionNotFound(self.session))
        }
    }
    fn touches(&self, _meta: &Metadata) -> Vec<Touch> {
        vec![Touch::Session(self.session)]
    }
    fn apply(&self, meta: &mut Metadata) {
        let op = meta.applied_op;
        if let Some(session) = meta.sessions.get_mut(&self.session) {
            session.ended_at.get_or_insert(op);
        }
        // Its consumer-group members leave with it.
        super::members::end_session(meta, self.session);
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.put_u64_be(self.session);
    }
    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        Ok(Self {
            session: r.u64("session")?,
        })
    }
}
