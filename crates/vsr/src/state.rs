//! The replicated state: the application's state machine and the client table, both
//! changed only by applying committed ops in order, so every replica holds the same.

use std::collections::BTreeMap;

use crate::message::{Operation, Refusal};
use crate::op_map::OpMap;

/// What ops do when they are applied. Implementations must be deterministic.
pub trait StateMachine {
    /// Applies a committed request; returns its result.
    fn apply(&mut self, op: u64, input: &[u8]) -> Vec<u8>;
    /// The whole state, for state transfer and checkpoints.
    fn snapshot(&self) -> Vec<u8>;
    /// Replaces the state with a snapshot.
    ///
    /// # Errors
    /// The snapshot does not decode.
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String>;
    /// A committed request that did not run: a retry answered from the client table, an
    /// unknown session, an old request number. Its op is committed all the same, so a
    /// machine whose journal keeps every committed body where the machine places it
    /// (the partition log, whose offsets the machine hands out) accounts for the body
    /// here; most machines ignore it.
    fn skipped(&mut self, _op: u64, _input: &[u8]) {}
}

/// A small state machine for tests: named counters. Input `key=delta` adds `delta`
/// (an i64) to `key` and returns the new value as decimal text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CounterMachine {
    counters: BTreeMap<String, i64>,
}

impl CounterMachine {
    /// The value of a counter.
    pub fn get(&self, key: &str) -> i64 {
        self.counters.get(key).copied().unwrap_or(0)
    }
}

impl StateMachine for CounterMachine {
    fn apply(&mut self, _op: u64, input: &[u8]) -> Vec<u8> {
        let text = String::from_utf8_lossy(input);
        let Some((key, delta)) = text.split_once('=') else {
            return b"bad input".to_vec();
        };
        let Ok(delta) = delta.parse::<i64>() else {
            return b"bad delta".to_vec();
        };
        let value = self.counters.entry(key.to_owned()).or_insert(0);
        *value = value.wrapping_add(delta);
        value.to_string().into_bytes()
    }

    fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (key, value) in &self.counters {
            out.extend_from_slice(format!("{key}={value}\n").as_bytes());
        }
        out
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let text = std::str::from_utf8(snapshot).map_err(|e| e.to_string())?;
        let mut counters = BTreeMap::new();
        for line in text.lines() {
            let (key, value) = line.split_once('=').ok_or("bad snapshot line")?;
            counters.insert(
                key.to_owned(),
                value.parse().map_err(|_| "bad snapshot value")?,
            );
        }
        self.counters = counters;
        Ok(())
    }
}

/// A registered session's last request and its reply.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Session {
    /// The client that registered it: replies to its requests go there.
    client: u64,
    request: u64,
    reply: Vec<u8>,
    /// The op that last touched it: the oldest is evicted first.
    last_op: u64,
}

/// What applying an op did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The result for the client.
    pub result: Result<Vec<u8>, Refusal>,
    /// Whether the state machine ran (false for a duplicate or refused request).
    pub executed: bool,
    /// A session evicted to make room for a new one.
    pub evicted: Option<u64>,
}

/// The state machine with the client table that makes requests idempotent.
#[derive(Debug, Clone)]
pub struct ReplicatedState<S> {
    machine: S,
    sessions: OpMap<Session>,
    sessions_max: usize,
    /// Client id -> (latest registration attempt, the session it got). Kept for more
    /// clients than sessions, so a replayed old register is refused even after its
    /// session was evicted.
    registrations: OpMap<(u64, u64)>,
}

impl<S: StateMachine> ReplicatedState<S> {
    /// A fresh state holding at most `sessions_max` sessions.
    pub fn new(machine: S, sessions_max: usize) -> Self {
        Self {
            machine,
            sessions: OpMap::default(),
            sessions_max: sessions_max.max(1),
            registrations: OpMap::default(),
        }
    }

    /// The application state machine.
    pub fn machine(&self) -> &S {
        &self.machine
    }

    /// The cached reply of `session` if `request` is its last one.
    pub fn cached(&self, session: u64, request: u64) -> Option<Result<Vec<u8>, Refusal>> {
        let entry = self.sessions.get(&session)?;
        match request.cmp(&entry.request) {
            std::cmp::Ordering::Equal => Some(Ok(entry.reply.clone())),
            std::cmp::Ordering::Less => Some(Err(Refusal::RequestTooOld)),
            std::cmp::Ordering::Greater => None,
        }
    }

    /// The answer to a register from `client` with `attempt`, if it is a retry of the
    /// latest one (its session) or older than it (refused).
    pub fn registration(&self, client: u64, attempt: u64) -> Option<Result<Vec<u8>, Refusal>> {
        let (latest, session) = self.registrations.get(&client)?;
        match attempt.cmp(latest) {
            std::cmp::Ordering::Equal => Some(Ok(session.to_be_bytes().to_vec())),
            std::cmp::Ordering::Less => Some(Err(Refusal::RequestTooOld)),
            std::cmp::Ordering::Greater => None,
        }
    }

    /// The client that registered `session`, while it is registered.
    pub fn client_of(&self, session: u64) -> Option<u64> {
        self.sessions.get(&session).map(|s| s.client)
    }

    /// Whether a session is registered.
    pub fn has_session(&self, session: u64) -> bool {
        self.sessions.contains_key(&session)
    }

    /// Applies a committed op.
    pub fn apply(
        &mut self,
        op: u64,
        operation: Operation,
        session: u64,
        request: u64,
        body: &[u8],
    ) -> Applied {
        match operation {
            Operation::Root => Applied {
                result: Ok(Vec::new()),
                executed: false,
                evicted: None,
            },
            Operation::Register => {
                let client = body.get(..8).map_or(0, |raw| {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(raw);
                    u64::from_be_bytes(b)
                });
                if let Some(answer) = self.registration(client, request) {
                    return Applied {
                        result: answer,
                        executed: false,
                        evicted: None,
                    };
                }
                let mut evicted = None;
                if self.sessions.len() >= self.sessions_max {
                    // The same choice on every replica: the least recently used.
                    let oldest = self
                        .sessions
                        .iter()
                        .min_by_key(|(id, s)| (s.last_op, **id))
                        .map(|(id, _)| *id);
                    if let Some(oldest) = oldest {
                        self.sessions.remove(&oldest);
                        evicted = Some(oldest);
                    }
                }
                self.sessions.insert(
                    op,
                    Session {
                        client,
                        request: 0,
                        reply: op.to_be_bytes().to_vec(),
                        last_op: op,
                    },
                );
                self.registrations.insert(client, (request, op));
                if self.registrations.len() > self.sessions_max * 4 {
                    // Forget the client registered longest ago.
                    let oldest = self
                        .registrations
                        .iter()
                        .min_by_key(|(c, (_, s))| (*s, **c))
                        .map(|(c, _)| *c);
                    if let Some(oldest) = oldest {
                        self.registrations.remove(&oldest);
                    }
                }
                Applied {
                    result: Ok(op.to_be_bytes().to_vec()),
                    executed: true,
                    evicted,
                }
            }
            Operation::Request => {
                if let Some(cached) = self.cached(session, request) {
                    self.machine.skipped(op, body);
                    return Applied {
                        result: cached,
                        executed: false,
                        evicted: None,
                    };
                }
                let Some(entry) = self.sessions.get_mut(&session) else {
                    self.machine.skipped(op, body);
                    return Applied {
                        result: Err(Refusal::SessionUnknown),
                        executed: false,
                        evicted: None,
                    };
                };
                let reply = self.machine.apply(op, body);
                entry.request = request;
                entry.reply = reply.clone();
                entry.last_op = op;
                Applied {
                    result: Ok(reply),
                    executed: true,
                    evicted: None,
                }
            }
        }
    }

    /// The whole state as bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(self.sessions.len() as u64).to_be_bytes());
        for (id, s) in self.sessions.iter() {
            out.extend_from_slice(&id.to_be_bytes());
            out.extend_from_slice(&s.client.to_be_bytes());
            out.extend_from_slice(&s.request.to_be_bytes());
            out.extend_from_slice(&s.last_op.to_be_bytes());
            out.extend_from_slice(&(s.reply.len() as u64).to_be_bytes());
            out.extend_from_slice(&s.reply);
        }
        out.extend_from_slice(&(self.registrations.len() as u64).to_be_bytes());
        for (client, (attempt, session)) in self.registrations.iter() {
            out.extend_from_slice(&client.to_be_bytes());
            out.extend_from_slice(&attempt.to_be_bytes());
            out.extend_from_slice(&session.to_be_bytes());
        }
        out.extend_from_slice(&self.machine.snapshot());
        out
    }

    /// Replaces the state with a snapshot.
    ///
    /// # Errors
    /// The snapshot does not decode.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), String> {
        let mut reader = Words { bytes, at: 0 };
        let count = reader.word()?;
        let mut sessions = OpMap::default();
        for _ in 0..count {
            let id = reader.word()?;
            let client = reader.word()?;
            let request = reader.word()?;
            let last_op = reader.word()?;
            let len = reader.word()? as usize;
            let reply = reader.take(len)?.to_vec();
            sessions.insert(
                id,
                Session {
                    client,
                    request,
                    reply,
                    last_op,
                },
            );
        }
        let mut registrations = OpMap::default();
        for _ in 0..reader.word()? {
            let client = reader.word()?;
            let attempt = reader.word()?;
            let session = reader.word()?;
            registrations.insert(client, (attempt, session));
        }
        self.machine.restore(&bytes[reader.at..])?;
        self.sessions = sessions;
        self.registrations = registrations;
        Ok(())
    }
}

struct Words<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Words<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], String> {
        let slice = self
            .bytes
            .get(self.at..self.at.saturating_add(len))
            .ok_or("snapshot truncated")?;
        self.at += len;
        Ok(slice)
    }

    fn word(&mut self) -> Result<u64, String> {
        let raw = self.take(8)?;
        let mut b = [0u8; 8];
        b.copy_from_slice(raw);
        Ok(u64::from_be_bytes(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn register(
        state: &mut ReplicatedState<CounterMachine>,
        op: u64,
        client: u64,
        attempt: u64,
    ) -> Applied {
        state.apply(op, Operation::Register, 0, attempt, &client.to_be_bytes())
    }

    #[test]
    fn requests_apply_once_and_retries_get_the_cached_reply() {
        let mut state = ReplicatedState::new(CounterMachine::default(), 4);
        assert!(register(&mut state, 1, 77, 1).executed);
        let first = state.apply(2, Operation::Request, 1, 1, b"a=5");
        assert_eq!(first.result, Ok(b"5".to_vec()));
        let retry = state.apply(3, Operation::Request, 1, 1, b"a=5");
        assert!(!retry.executed);
        assert_eq!(retry.result, Ok(b"5".to_vec()));
        assert_eq!(state.machine().get("a"), 5, "applied once");
        state.apply(4, Operation::Request, 1, 2, b"a=1");
        assert_eq!(
            state.apply(5, Operation::Request, 1, 1, b"a=5").result,
            Err(Refusal::RequestTooOld)
        );
        assert_eq!(
            state.apply(6, Operation::Request, 99, 1, b"a=1").result,
            Err(Refusal::SessionUnknown)
        );
    }

    /// Counts the committed requests it ran and those it was told were skipped.
    #[derive(Debug, Default)]
    struct Tally {
        ran: Vec<u64>,
        skipped: Vec<u64>,
    }

    impl StateMachine for Tally {
        fn apply(&mut self, op: u64, _input: &[u8]) -> Vec<u8> {
            self.ran.push(op);
            Vec::new()
        }
        fn snapshot(&self) -> Vec<u8> {
            Vec::new()
        }
        fn restore(&mut self, _snapshot: &[u8]) -> Result<(), String> {
            Ok(())
        }
        fn skipped(&mut self, op: u64, _input: &[u8]) {
            self.skipped.push(op);
        }
    }

    #[test]
    fn every_committed_request_that_does_not_run_is_told_to_the_machine() {
        let mut state = ReplicatedState::new(Tally::default(), 4);
        state.apply(1, Operation::Register, 0, 1, &77u64.to_be_bytes());
        state.apply(2, Operation::Request, 1, 1, b"x");
        state.apply(3, Operation::Request, 1, 1, b"x"); // a retry
        state.apply(4, Operation::Request, 1, 2, b"x");
        state.apply(5, Operation::Request, 1, 1, b"x"); // too old
        state.apply(6, Operation::Request, 99, 1, b"x"); // unknown session
        assert_eq!(state.machine().ran, vec![2, 4]);
        assert_eq!(state.machine().skipped, vec![3, 5, 6]);
    }

    #[test]
    fn eviction_is_least_recently_used_and_old_registers_are_refused() {
        let mut state = ReplicatedState::new(CounterMachine::default(), 2);
        register(&mut state, 1, 10, 1);
        register(&mut state, 2, 20, 1);
        state.apply(3, Operation::Request, 1, 1, b"x=1"); // session 1 used last
        let third = register(&mut state, 4, 30, 1);
        assert_eq!(third.evicted, Some(2), "session 2 was least recently used");
        assert_eq!(
            state.apply(5, Operation::Request, 2, 1, b"x=1").result,
            Err(Refusal::SessionUnknown)
        );
        // Client 20 registers again (attempt 2); its old register replayed is refused.
        assert!(register(&mut state, 6, 20, 2).executed);
        let replay = register(&mut state, 7, 20, 1);
        assert_eq!(replay.result, Err(Refusal::RequestTooOld));
        assert!(!replay.executed);
        // A retry of the latest attempt gets the same session.
        assert_eq!(
            register(&mut state, 8, 20, 2).result,
            Ok(6u64.to_be_bytes().to_vec())
        );
    }

    #[test]
    fn snapshots_round_trip() {
        let mut state = ReplicatedState::new(CounterMachine::default(), 3);
        register(&mut state, 1, 5, 1);
        state.apply(2, Operation::Request, 1, 1, b"k=3");
        let bytes = state.snapshot();
        let mut copy = ReplicatedState::new(CounterMachine::default(), 3);
        copy.restore(&bytes).unwrap();
        assert_eq!(copy.snapshot(), bytes);
        assert_eq!(copy.machine().get("k"), 3);
        assert!(copy.restore(&bytes[..bytes.len() / 2]).is_err() || bytes.len() < 2);
    }
}
