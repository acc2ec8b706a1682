//! The coordinator's watch over client sessions: when each open session was last
//! heard from, and which ones have gone quiet for their timeout and must be ended by a
//! committed `EndSession`. Pure: time comes in as milliseconds, the sessions as the
//! metadata holds them; the coordinator proposes what [`Liveness::expired`] returns.
//!
//! Liveness is in memory on the coordinator (the metadata primary) alone, as
//! consumer-group membership is: a heartbeat is not worth a replicated op. A new
//! coordinator has heard from nobody, so it gives every open session a whole timeout
//! from when it took over; a session is never ended sooner than its timeout after
//! the last heartbeat any coordinator could have taken.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::metadata::ClientSession;

/// How often the open sessions are walked for expiry.
const CHECK_EVERY_MS: u64 = 100;

/// Deadlines of the open sessions this coordinator watches.
#[derive(Debug, Default)]
pub(crate) struct Liveness {
    /// The metadata view this coordinator watches in: a new view, a new watch.
    view: u64,
    /// Session -> the time it ends unless heard from again.
    deadlines: HashMap<u64, u64>,
    /// Sessions whose end was proposed and not yet seen applied.
    ending: HashSet<u64>,
    next_check: u64,
}

impl Liveness {
    /// Starts a new watch if the coordinator's view changed: it has heard from nobody.
    pub(crate) fn enter_view(&mut self, view: u64) {
        if view != self.view {
            *self = Self {
                view,
                ..Self::default()
            };
        }
    }

    /// `session` (open, with `timeout_ms`) was heard from at `now`: registered, or a
    /// heartbeat.
    pub(crate) fn heard(&mut self, session: u64, timeout_ms: u32, now: u64) {
        self.deadlines
            .insert(session, now.saturating_add(u64::from(timeout_ms)));
    }

    /// The open sessions of `sessions` that missed their timeout by `now`, each
    /// returned once (its end is being proposed); a session first seen here gets a
    /// whole timeout from `now`. Ended and retired sessions are forgotten.
    pub(crate) fn expired(
        &mut self,
        sessions: &BTreeMap<u64, ClientSession>,
        now: u64,
    ) -> Vec<u64> {
        if now < self.next_check {
            return Vec::new();
        }
        self.next_check = now + CHECK_EVERY_MS;
        self.deadlines
            .retain(|id, _| sessions.get(id).is_some_and(|s| s.ended_at.is_none()));
        self.ending
            .retain(|id| sessions.get(id).is_some_and(|s| s.ended_at.is_none()));
        let mut expired = Vec::new();
        for (id, session) in sessions {
            if session.ended_at.is_some() || self.ending.contains(id) {
                continue;
            }
            let deadline = *self
                .deadlines
                .entry(*id)
                .or_insert_with(|| now.saturating_add(u64::from(session.timeout_ms)));
            if deadline <= now {
                self.ending.insert(*id);
                expired.push(*id);
            }
        }
        expired
    }

    /// An end proposed for `session` failed: it is proposed again at its next check.
    pub(crate) fn end_failed(&mut self, session: u64) {
        self.ending.remove(&session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(timeout_ms: u32) -> ClientSession {
        ClientSession {
            timeout_ms,
            ended_at: None,
        }
    }

    #[test]
    fn a_quiet_session_is_ended_once_after_its_timeout() {
        let mut sessions = BTreeMap::from([(3, open(1_000)), (5, open(5_000))]);
        let mut liveness = Liveness::default();
        liveness.enter_view(1);
        liveness.heard(3, 1_000, 0);
        assert!(
            liveness.expired(&sessions, 0).is_empty(),
            "5: a whole timeout from now"
        );
        liveness.heard(3, 1_000, 900);
        assert!(
            liveness.expired(&sessions, 1_500).is_empty(),
            "heard at 900"
        );
        assert_eq!(liveness.expired(&sessions, 1_900), vec![3]);
        assert!(liveness.expired(&sessions, 2_000).is_empty(), "once");
        liveness.end_failed(3);
        assert_eq!(
            liveness.expired(&sessions, 2_100),
            vec![3],
            "again after a failure"
        );
        sessions.insert(
            3,
            ClientSession {
                timeout_ms: 1_000,
                ended_at: Some(9),
            },
        );
        assert_eq!(liveness.expired(&sessions, 5_000), vec![5]);
        assert!(
            liveness.expired(&sessions, 9_000).is_empty(),
            "3 ended, 5 ending"
        );
    }

    #[test]
    fn a_new_coordinator_gives_every_session_a_whole_timeout() {
        let sessions = BTreeMap::from([(3, open(1_000))]);
        let mut liveness = Liveness::default();
        liveness.enter_view(1);
        liveness.heard(3, 1_000, 0);
        liveness.enter_view(4);
        assert!(liveness.expired(&sessions, 900).is_empty());
        assert!(
            liveness.expired(&sessions, 1_800).is_empty(),
            "its timeout counts from 900"
        );
        assert_eq!(liveness.expired(&sessions, 1_900), vec![3]);
    }

    #[test]
    fn checks_are_spaced() {
        let sessions = BTreeMap::from([(3, open(1_000))]);
        let mut liveness = Liveness::default();
        liveness.heard(3, 1_000, 0);
        assert!(liveness.expired(&sessions, 950).is_empty());
        assert!(
            liveness.expired(&sessions, 1_000).is_empty(),
            "checked at 950: next at 1,050"
        );
        assert_eq!(liveness.expired(&sessions, 1_050), vec![3]);
    }
}
