//! Pacing at a target rate, measured from the intended send time.
//!
//! A run at a fixed rate has a schedule: record `n` is due at `n / rate` after the start.
//! A batch is due when its last record's token accrues. If the sender falls behind (the
//! node stalled, the socket was full), it sends back to back until it catches up, and the
//! latency of every late record counts from when it was due, not from when it finally
//! went out; otherwise a stall would delay the measurements along with the sends and
//! hide itself (coordinated omission).

use std::num::NonZeroU64;
use std::time::Duration;

/// What the sender does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pacing {
    /// Send the batch now; its latency counts from `intended`.
    Send {
        /// When the batch was due (time since the start of the run).
        intended: Duration,
    },
    /// Too early: come back at this time (since the start of the run).
    WaitUntil(Duration),
}

/// A token bucket with a schedule, for one sender. Pure: the caller passes the time.
#[derive(Debug, Clone)]
pub struct Pacer {
    rate: Option<NonZeroU64>,
    granted: u64,
    lead: Duration,
}

impl Pacer {
    /// A pacer at `rate` records per second, or unpaced (`None`: as fast as possible).
    pub fn new(rate: Option<NonZeroU64>) -> Self {
        Self {
            rate,
            granted: 0,
            lead: Duration::ZERO,
        }
    }

    /// Lets batches go out up to `lead` before they are due. A sender that sleeps on a
    /// coarse timer (tokio's ticks in milliseconds) wakes up to a tick late; without a
    /// lead that lateness would count as the node's latency. An early batch's latency
    /// counts from when it left; a late one's still from when it was due.
    pub fn with_lead(mut self, lead: Duration) -> Self {
        self.lead = lead;
        self
    }

    /// Records granted so far.
    pub fn granted(&self) -> u64 {
        self.granted
    }

    /// Asks to send `count` records at `now` (time since the start of the run).
    pub fn take(&mut self, now: Duration, count: u64) -> Pacing {
        let Some(rate) = self.rate else {
            self.granted += count;
            return Pacing::Send { intended: now };
        };
        let due = due_at(self.granted.saturating_add(count), rate);
        if due > now + self.lead {
            return Pacing::WaitUntil(due - self.lead);
        }
        self.granted += count;
        // Early (within the lead): from now. Late: from when it was due.
        Pacing::Send {
            intended: due.min(now),
        }
    }
}

/// When the token of record `n` (counting from 1) accrues at `rate` per second.
fn due_at(n: u64, rate: NonZeroU64) -> Duration {
    let nanos = u128::from(n) * 1_000_000_000 / u128::from(rate.get());
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(r: u64) -> Option<NonZeroU64> {
        NonZeroU64::new(r)
    }

    #[test]
    fn unpaced_sends_at_once_from_now() {
        let mut pacer = Pacer::new(None);
        let now = Duration::from_millis(7);
        assert_eq!(pacer.take(now, 1_000), Pacing::Send { intended: now });
        assert_eq!(pacer.granted(), 1_000);
    }

    #[test]
    fn a_batch_waits_for_its_last_token() {
        // 1,000 records/s, batches of 100: each batch is due 100 ms after the last.
        let mut pacer = Pacer::new(rate(1_000));
        assert_eq!(
            pacer.take(Duration::ZERO, 100),
            Pacing::WaitUntil(Duration::from_millis(100))
        );
        assert_eq!(
            pacer.take(Duration::from_millis(100), 100),
            Pacing::Send {
                intended: Duration::from_millis(100)
            }
        );
        assert_eq!(
            pacer.take(Duration::from_millis(150), 100),
            Pacing::WaitUntil(Duration::from_millis(200))
        );
    }

    #[test]
    fn a_late_sender_catches_up_and_latency_counts_from_the_schedule() {
        let mut pacer = Pacer::new(rate(1_000));
        // The sender stalled for a second: ten batches are overdue. All go at once, each
        // with the time it was due, so the stall shows in their latency.
        let now = Duration::from_millis(1_000);
        let mut intended = Vec::new();
        while let Pacing::Send { intended: at } = pacer.take(now, 100) {
            intended.push(at);
        }
        assert_eq!(intended.len(), 10);
        assert_eq!(intended[0], Duration::from_millis(100));
        assert_eq!(intended[9], Duration::from_millis(1_000));
    }

    #[test]
    fn a_lead_sends_a_tick_early_from_now_and_late_batches_from_the_schedule() {
        let ms = Duration::from_millis;
        // 1,000 records/s, batches of 100: due at 100 ms, 200 ms, ...
        let mut pacer = Pacer::new(rate(1_000)).with_lead(ms(1));
        assert_eq!(pacer.take(ms(50), 100), Pacing::WaitUntil(ms(99)));
        // Woken within the lead: goes now, and counts from now.
        let now = Duration::from_micros(99_400);
        assert_eq!(pacer.take(now, 100), Pacing::Send { intended: now });
        // Behind the schedule: counts from when it was due.
        assert_eq!(pacer.take(ms(250), 100), Pacing::Send { intended: ms(200) });
        assert_eq!(pacer.granted(), 200);
    }

    #[test]
    fn the_achieved_rate_matches_the_target_over_a_simulated_run() {
        // A sender that always sleeps exactly until told, five seconds at 12,345/s.
        let mut pacer = Pacer::new(rate(12_345));
        let mut now = Duration::ZERO;
        let end = Duration::from_secs(5);
        while now < end {
            match pacer.take(now, 50) {
                Pacing::Send { .. } => {}
                Pacing::WaitUntil(at) => now = at,
            }
        }
        let achieved = pacer.granted() as f64 / end.as_secs_f64();
        assert!((achieved / 12_345.0 - 1.0).abs() < 0.01, "{achieved}");
    }
}
