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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::metadata::ClientSession;

/// Refuses `user` (`None`: nobody logged in) a session whose owner is `owner`
/// (`PermissionDenied`): only its owner produces under it (the offsets a retry of its
/// request is answered with are its owner's), heartbeats it, ends it or joins a
/// group with it. A session registered without a login has no owner.
pub(crate) fn owner_refusal(
    session: u64,
    owner: Option<&str>,
    user: Option<&str>,
) -> Option<crate::error::NodeError> {
    not_theirs("client session", session, owner, user)
}

/// `PermissionDenied` for `user` if `what` `id` belongs to `owner`, another user.
pub(crate) fn not_theirs(
    what: &str,
    id: u64,
    owner: Option<&str>,
    user: Option<&str>,
) -> Option<crate::error::NodeError> {
    let owner = owner?;
    (user != Some(owner)).then(|| {
        crate::error::NodeError::new(
            braid_proto::client::ErrorCode::PermissionDenied,
            format!("{what} {id} belongs to another user"),
        )
    })
}

/// How often the deadlines due are looked at.
const CHECK_EVERY_MS: u64 = 100;
/// How often every open session is looked at, to watch one this coordinator has not
/// heard from (the first look of a view gives each a whole timeout). Between these,
/// a check costs the sessions due, not the sessions open.
const SWEEP_EVERY_MS: u64 = 10_000;

/// Deadlines of the open sessions this coordinator watches.
#[derive(Debug, Default)]
pub(crate) struct Liveness {
    /// The metadata view this coordinator watches in: a new view, a new watch.
    view: u64,
    /// Session -> the time it ends unless heard from again.
    deadlines: HashMap<u64, u64>,
    /// The same, ordered by deadline: a check takes the ones due off the front.
    by_deadline: BTreeSet<(u64, u64)>,
    /// Sessions whose end was proposed and not yet seen applied.
    ending: HashSet<u64>,
    next_check: u64,
    next_sweep: u64,
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

    fn watch(&mut self, session: u64, deadline: u64) {
        if let Some(before) = self.deadlines.insert(session, deadline) {
            self.by_deadline.remove(&(before, session));
        }
        self.by_deadline.insert((deadline, session));
    }

    /// `session` (open, with `timeout_ms`) was heard from at `now`: registered, or a
    /// heartbeat.
    pub(crate) fn heard(&mut self, session: u64, timeout_ms: u32, now: u64) {
        self.watch(session, now.saturating_add(u64::from(timeout_ms)));
    }

    /// The open sessions of `sessions` that missed their timeout by `now`, each
    /// returned once (its end is being proposed); a session first seen here gets a
    /// whole timeout from `now`. Ended and retired sessions are forgotten when their
    /// deadline comes (or at the next sweep).
    pub(crate) fn expired(
        &mut self,
        sessions: &BTreeMap<u64, ClientSession>,
        now: u64,
    ) -> Vec<u64> {
        if now < self.next_check {
            return Vec::new();
        }
        self.next_check = now + CHECK_EVERY_MS;
        let open = |id: &u64| sessions.get(id).is_some_and(|s| s.ended_at.is_none());
        if now >= self.next_sweep {
            self.next_sweep = now + SWEEP_EVERY_MS;
            self.ending.retain(open);
            let unwatched: Vec<(u64, u32)> = sessions
                .iter()
                .filter(|(id, s)| {
                    s.ended_at.is_none()
                        && !self.deadlines.contains_key(id)
                        && !self.ending.contains(id)
                })
                .map(|(id, s)| (*id, s.timeout_ms))
                .collect();
            for (id, timeout_ms) in unwatched {
                self.heard(id, timeout_ms, now);
            }
        }
        let mut expired = Vec::new();
        while let Some(&(deadline, id)) = self.by_deadline.first() {
            if deadline > now {
                break;
            }
            self.by_deadline.pop_first();
            self.deadlines.remove(&id);
            if open(&id) && self.ending.insert(id) {
                expired.push(id);
            }
        }
        expired
    }

    /// An end proposed for `session` failed: it is proposed again at its next check.
    pub(crate) fn end_failed(&mut self, session: u64) {
        self.ending.remove(&session);
        self.watch(session, 0);
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

    /// A check walks the deadlines due, not every session: ended sessions drop off
    /// when their deadline comes, and one the coordinator never heard from is found
    /// by the next sweep and given a whole timeout.
    #[test]
    fn a_check_costs_the_deadlines_due_and_a_sweep_finds_the_unwatched() {
        let mut sessions: BTreeMap<u64, ClientSession> =
            (1..=1_000).map(|id| (id, open(60_000))).collect();
        let mut liveness = Liveness::default();
        liveness.enter_view(1);
        assert!(liveness.expired(&sessions, 0).is_empty(), "the first sweep");
        assert_eq!(liveness.by_deadline.len(), 1_000);
        for id in 2..=1_000 {
            liveness.heard(id, 60_000, 30_000);
        }
        sessions.insert(1_001, open(1_000));
        if let Some(ended) = sessions.get_mut(&500) {
            ended.ended_at = Some(1_002);
        }
        assert_eq!(
            liveness.expired(&sessions, 60_000),
            vec![1],
            "only 1 was due"
        );
        assert_eq!(
            liveness.expired(&sessions, 61_000),
            vec![1_001],
            "unwatched until the sweep at 10 s, then a whole timeout"
        );
        assert!(liveness.expired(&sessions, 89_000).is_empty());
        let due = liveness.expired(&sessions, 90_000);
        assert_eq!(
            due.len(),
            998,
            "every open one heard at 30 s, not the ended 500"
        );
        assert!(!due.contains(&500));
        assert!(liveness.deadlines.is_empty() && liveness.by_deadline.is_empty());
    }
}
