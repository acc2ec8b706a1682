//! The node's door for strangers, with authentication on: how many connections that
//! have not logged in it holds (over the node, and per source address), and how long a
//! login waits after failures. Pure: time is an input, no sockets.
//!
//! Strangers get a budget of their own, so that connections that never log in cannot
//! take the slots of users who do (found by review: 100 of them refused 48 of 50 good
//! logins). A login from a source address, or for a user, with recent failures waits
//! before it is answered, growing with the failures (a guesser's rate falls to a few
//! tries a second per source), never more than [`LOGIN_DELAY_MAX`]: a stranger can
//! slow a user's logins down, never lock the user out.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

/// Failures older than this are forgotten.
pub(crate) const FAILURE_WINDOW_MS: u64 = 60_000;
/// Failures a source or user may have before its logins wait.
pub(crate) const FAILURES_FREE: u32 = 3;
/// The first wait; each further failure doubles it.
pub(crate) const LOGIN_DELAY_FIRST: Duration = Duration::from_millis(100);
/// The longest wait.
pub(crate) const LOGIN_DELAY_MAX: Duration = Duration::from_secs(5);
/// Sources and users with failures remembered, at most: past it the oldest go.
const FAILURES_REMEMBERED_MAX: usize = 100_000;

/// How many strangers the door lets in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DoorLimits {
    /// Connections not logged in, over the node.
    pub(crate) strangers: u32,
    /// Connections not logged in, per source address.
    pub(crate) strangers_per_source: u32,
    /// Connections logged in, per user.
    pub(crate) per_user: u32,
}

/// Why a stranger was turned away at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turned {
    /// The node holds `connections_unauthenticated_max` strangers.
    Node,
    /// This source holds `connections_unauthenticated_per_source_max` strangers.
    Source,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last_ms: u64,
}

/// Who failed to log in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Who {
    Source(IpAddr),
    User(String),
}

/// The door's state.
#[derive(Debug)]
pub(crate) struct Door {
    limits: DoorLimits,
    strangers: HashMap<IpAddr, u32>,
    strangers_total: u32,
    failures: HashMap<Who, Failures>,
    /// Connections logged in, by user.
    logged_in: HashMap<String, u32>,
}

impl Door {
    pub(crate) fn new(limits: DoorLimits) -> Self {
        Self {
            limits,
            strangers: HashMap::new(),
            strangers_total: 0,
            failures: HashMap::new(),
            logged_in: HashMap::new(),
        }
    }

    /// Lets a new connection from `source` in as a stranger, or says why not; one let
    /// in must be given back with [`Door::stranger_gone`] (logged in, or closed).
    pub(crate) fn admit(&mut self, source: IpAddr) -> Result<(), Turned> {
        if self.strangers_total >= self.limits.strangers {
            return Err(Turned::Node);
        }
        let count = self.strangers.entry(source).or_default();
        if *count >= self.limits.strangers_per_source {
            return Err(Turned::Source);
        }
        *count += 1;
        self.strangers_total += 1;
        Ok(())
    }

    /// A stranger from `source` logged in or left.
    pub(crate) fn stranger_gone(&mut self, source: IpAddr) {
        if let Some(count) = self.strangers.get_mut(&source) {
            *count -= 1;
            self.strangers_total -= 1;
            if *count == 0 {
                self.strangers.remove(&source);
            }
        }
    }

    /// Lets a connection that just logged in as `user` stay, or refuses it (false)
    /// when the user holds `connections_per_user_max` already; one let in must be
    /// given back with [`Door::user_gone`].
    pub(crate) fn admit_user(&mut self, user: &str) -> bool {
        let count = self.logged_in.entry(user.to_owned()).or_default();
        if *count >= self.limits.per_user {
            return false;
        }
        *count += 1;
        true
    }

    /// A connection logged in as `user` closed.
    pub(crate) fn user_gone(&mut self, user: &str) {
        if let Some(count) = self.logged_in.get_mut(user) {
            *count -= 1;
            if *count == 0 {
                self.logged_in.remove(user);
            }
        }
    }

    /// Strangers held now.
    #[cfg(test)]
    pub(crate) fn strangers(&self) -> u32 {
        self.strangers_total
    }

    /// How long a login from `source` for `user` waits before it is answered, at
    /// `now_ms`: nothing until [`FAILURES_FREE`] recent failures of the source or of
    /// the user, then doubling from [`LOGIN_DELAY_FIRST`] up to [`LOGIN_DELAY_MAX`].
    pub(crate) fn login_delay(&self, source: IpAddr, user: &str, now_ms: u64) -> Duration {
        let recent = |who: &Who| {
            self.failures
                .get(who)
                .filter(|f| now_ms.saturating_sub(f.last_ms) < FAILURE_WINDOW_MS)
                .map_or(0, |f| f.count)
        };
        let failures = recent(&Who::Source(source)).max(recent(&Who::User(user.to_owned())));
        if failures < FAILURES_FREE {
            return Duration::ZERO;
        }
        let doublings = (failures - FAILURES_FREE).min(16);
        LOGIN_DELAY_FIRST
            .saturating_mul(1 << doublings)
            .min(LOGIN_DELAY_MAX)
    }

    /// A login from `source` failed, for `user` if it named one.
    pub(crate) fn login_failed(&mut self, source: IpAddr, user: Option<&str>, now_ms: u64) {
        if self.failures.len() >= FAILURES_REMEMBERED_MAX {
            self.failures
                .retain(|_, f| now_ms.saturating_sub(f.last_ms) < FAILURE_WINDOW_MS);
            if self.failures.len() >= FAILURES_REMEMBERED_MAX {
                self.failures.clear();
            }
        }
        let who = std::iter::once(Who::Source(source)).chain(user.map(|u| Who::User(u.into())));
        for who in who {
            let entry = self.failures.entry(who).or_insert(Failures {
                count: 0,
                last_ms: now_ms,
            });
            if now_ms.saturating_sub(entry.last_ms) >= FAILURE_WINDOW_MS {
                entry.count = 0;
            }
            entry.count = entry.count.saturating_add(1);
            entry.last_ms = now_ms;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn strangers_are_held_per_source_and_over_the_node() {
        let mut door = Door::new(DoorLimits {
            strangers: 3,
            strangers_per_source: 2,
            per_user: 2,
        });
        door.admit(ip(1)).unwrap();
        door.admit(ip(1)).unwrap();
        assert_eq!(door.admit(ip(1)), Err(Turned::Source));
        door.admit(ip(2)).unwrap();
        assert_eq!(door.admit(ip(3)), Err(Turned::Node));
        door.stranger_gone(ip(1));
        assert_eq!(door.strangers(), 2);
        door.admit(ip(3)).unwrap();
        door.stranger_gone(ip(9)); // never let in: nothing to give back
        assert_eq!(door.strangers(), 3);
    }

    #[test]
    fn failures_slow_logins_down_but_never_lock_a_user_out() {
        let mut door = Door::new(DoorLimits {
            strangers: 10,
            strangers_per_source: 10,
            per_user: 10,
        });
        let now = 1_000_000;
        for _ in 0..FAILURES_FREE {
            assert_eq!(door.login_delay(ip(1), "alice", now), Duration::ZERO);
            door.login_failed(ip(1), Some("alice"), now);
        }
        assert_eq!(door.login_delay(ip(1), "bob", now), LOGIN_DELAY_FIRST);
        // The user is slowed from any source, a clean source for another user not.
        assert_eq!(door.login_delay(ip(2), "alice", now), LOGIN_DELAY_FIRST);
        assert_eq!(door.login_delay(ip(2), "bob", now), Duration::ZERO);
        door.login_failed(ip(1), Some("alice"), now);
        assert_eq!(door.login_delay(ip(1), "x", now), LOGIN_DELAY_FIRST * 2);
        for _ in 0..100 {
            door.login_failed(ip(1), Some("alice"), now);
        }
        assert_eq!(door.login_delay(ip(2), "alice", now), LOGIN_DELAY_MAX);
        // Forgotten after the window.
        let later = now + FAILURE_WINDOW_MS;
        assert_eq!(door.login_delay(ip(1), "alice", later), Duration::ZERO);
        door.login_failed(ip(1), None, later);
        assert_eq!(door.login_delay(ip(1), "alice", later), Duration::ZERO);
    }

    #[test]
    fn remembered_failures_are_bounded() {
        let mut door = Door::new(DoorLimits {
            strangers: 1,
            strangers_per_source: 1,
            per_user: 1,
        });
        for n in 0..(FAILURES_REMEMBERED_MAX as u64 + 10) {
            let source = IpAddr::from(std::net::Ipv6Addr::from(u128::from(n)));
            door.login_failed(source, None, n);
        }
        assert!(door.failures.len() <= FAILURES_REMEMBERED_MAX);
    }

    #[test]
    fn a_user_holds_at_most_its_connections() {
        let mut door = Door::new(DoorLimits {
            strangers: 3,
            strangers_per_source: 2,
            per_user: 2,
        });
        assert!(door.admit_user("mallory"));
        assert!(door.admit_user("mallory"));
        assert!(!door.admit_user("mallory"));
        assert!(door.admit_user("alice"), "another user is not held up");
        door.user_gone("mallory");
        assert!(door.admit_user("mallory"));
        door.user_gone("nobody"); // never let in: nothing to give back
    }
}
