//! The k links to one peer as one bundle, as a pure state machine.
//!
//! A node sends to a peer only while the bundle is complete: frames of a shard range
//! use only their own link, and a missing link would force a fallback that reorders
//! them. If one link closes, or the bundle stays incomplete for `handshake_grace`, all
//! k are closed and a new generation starts; the node with the lower id dials every
//! link of it again, with backoff. A link of an older generation is refused, so a
//! half-closed old link never joins a new bundle. A failed handshake changes nothing
//! here: it never reached the bundle.

/// What the shell must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BundleAction {
    /// Dial `link` for `generation`.
    Dial {
        /// The link.
        link: u16,
        /// The generation.
        generation: u32,
    },
    /// Close every link of the bundle (of any generation).
    CloseAll,
    /// The bundle is complete: sending may start.
    Up,
    /// The bundle is no longer complete: stop sending.
    Down,
}

/// Why a link was not taken into the bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LinkRefused {
    /// The link belongs to an older bundle generation.
    #[error("stale generation {theirs} (current {current})")]
    StaleGeneration {
        /// The link's.
        theirs: u32,
        /// The current.
        current: u32,
    },
    /// The link index is beyond k.
    #[error("no link {0}")]
    NoSuchLink(u16),
}

/// Backoff between redials: doubles from `first` up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first wait (ticks).
    pub first: u64,
    /// The longest wait (ticks).
    pub max: u64,
}

/// The bundle of links to one peer.
#[derive(Debug, Clone)]
pub struct Bundle {
    links: u16,
    we_dial: bool,
    grace: u64,
    backoff: Backoff,
    generation: u32,
    up: Vec<bool>,
    complete: bool,
    /// When the first link of the current generation came up: the grace for the rest
    /// runs from here, not from the last teardown (an acceptor idle for longer than a
    /// grace would otherwise close a lone new link at once).
    first_up: Option<u64>,
    /// When the bundle last came up: a teardown after it stayed up for a grace resets
    /// the backoff; an earlier one (a peer that refuses, a flapping link) does not.
    up_since: Option<u64>,
    /// When the dialer dials next.
    next_dial: Option<u64>,
    failures: u32,
    teardowns: u64,
    /// The peer process the current links belong to.
    peer_incarnation: Option<u64>,
}

impl Bundle {
    /// A bundle of `links` links to a peer; `we_dial` when our replica id is lower.
    pub fn new(links: u16, we_dial: bool, grace: u64, backoff: Backoff, now: u64) -> Self {
        Self {
            links,
            we_dial,
            grace,
            backoff,
            generation: 1,
            up: vec![false; usize::from(links)],
            complete: false,
            first_up: None,
            up_since: None,
            next_dial: we_dial.then_some(now),
            failures: 0,
            teardowns: 0,
            peer_incarnation: None,
        }
    }

    /// Whether frames may be sent to the peer.
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// The current generation.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Teardowns so far.
    pub fn teardowns(&self) -> u64 {
        self.teardowns
    }

    /// A link finished its handshake.
    ///
    /// # Errors
    /// [`LinkRefused`]: the shell closes that link; the bundle is unchanged.
    pub fn on_link_up(
        &mut self,
        now: u64,
        link: u16,
        generation: u32,
        incarnation: u64,
        out: &mut Vec<BundleAction>,
    ) -> Result<(), LinkRefused> {
        if link >= self.links {
            return Err(LinkRefused::NoSuchLink(link));
        }
        if self.peer_incarnation != Some(incarnation) {
            // The peer restarted (or this is its first link). Its old links are gone:
            // an acceptor starts a fresh bundle at the dialer's generation, however low
            // (before: it refused the restarted dialer's generations for as long as it
            // took them to climb past the old ones); a dialer drops a bundle half made
            // with the old process and redials.
            let mixed = self.up.iter().any(|u| *u);
            self.peer_incarnation = Some(incarnation);
            if mixed {
                self.teardown(out);
                if self.we_dial {
                    self.generation += 1;
                    self.schedule_dial(now);
                    return Err(LinkRefused::StaleGeneration {
                        theirs: generation,
                        current: self.generation,
                    });
                }
            }
            if !self.we_dial {
                self.generation = generation;
            }
        }
        if generation < self.generation {
            return Err(LinkRefused::StaleGeneration {
                theirs: generation,
                current: self.generation,
            });
        }
        if generation > self.generation {
            // The dialer started a newer bundle: everything of ours is stale.
            self.teardown(out);
            self.generation = generation;
        }
        if self.first_up.is_none() {
            self.first_up = Some(now);
        }
        self.up[usize::from(link)] = true;
        if !self.complete && self.up.iter().all(|u| *u) {
            self.complete = true;
            self.up_since = Some(now);
            out.push(BundleAction::Up);
        }
        Ok(())
    }

    /// A link of the bundle closed (or failed to dial).
    pub fn on_link_closed(
        &mut self,
        now: u64,
        link: u16,
        generation: u32,
        out: &mut Vec<BundleAction>,
    ) {
        if generation != self.generation || link >= self.links {
            return; // an older bundle's link: already torn down
        }
        self.count_failure(now);
        self.teardown(out);
        self.generation += 1;
        self.schedule_dial(now);
    }

    /// Time passed: tear down a bundle incomplete for longer than the grace; dial.
    pub fn on_tick(&mut self, now: u64, out: &mut Vec<BundleAction>) {
        if !self.complete
            && self
                .first_up
                .is_some_and(|first| now.saturating_sub(first) > self.grace)
        {
            self.count_failure(now);
            self.teardown(out);
            self.generation += 1;
            self.schedule_dial(now);
        }
        if self.next_dial.is_some_and(|t| t <= now) {
            self.next_dial = None;
            for link in 0..self.links {
                out.push(BundleAction::Dial {
                    link,
                    generation: self.generation,
                });
            }
        }
    }

    /// The next tick at which [`Bundle::on_tick`] has something to do.
    pub fn next_deadline(&self) -> Option<u64> {
        let grace = self
            .first_up
            .filter(|_| !self.complete)
            .map(|first| first + self.grace + 1);
        match (grace, self.next_dial) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn teardown(&mut self, out: &mut Vec<BundleAction>) {
        if self.complete {
            out.push(BundleAction::Down);
        }
        if self.complete || self.up.iter().any(|u| *u) {
            self.teardowns += 1;
        }
        self.complete = false;
        self.up.iter_mut().for_each(|u| *u = false);
        self.first_up = None;
        self.up_since = None;
        out.push(BundleAction::CloseAll);
    }

    /// A teardown is a failure for the backoff, unless the bundle had stayed up for a
    /// grace: only then does the backoff start over.
    fn count_failure(&mut self, now: u64) {
        if self
            .up_since
            .is_some_and(|since| now.saturating_sub(since) >= self.grace)
        {
            self.failures = 0;
        }
        self.failures = self.failures.saturating_add(1);
    }

    #[cfg(test)]
    fn on_link_up_test(
        &mut self,
        now: u64,
        link: u16,
        generation: u32,
        out: &mut Vec<BundleAction>,
    ) -> Result<(), LinkRefused> {
        self.on_link_up(now, link, generation, 1, out)
    }

    fn schedule_dial(&mut self, now: u64) {
        if self.we_dial {
            let exponent = self.failures.saturating_sub(1).min(20);
            let wait = (self.backoff.first << exponent).min(self.backoff.max);
            self.next_dial = Some(now + wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BACKOFF: Backoff = Backoff { first: 10, max: 80 };

    fn dials(actions: &[BundleAction]) -> Vec<(u16, u32)> {
        actions
            .iter()
            .filter_map(|a| match a {
                BundleAction::Dial { link, generation } => Some((*link, *generation)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_lower_id_dials_every_link_and_the_bundle_comes_up_whole() {
        let mut bundle = Bundle::new(3, true, 100, BACKOFF, 0);
        let mut out = Vec::new();
        bundle.on_tick(0, &mut out);
        assert_eq!(dials(&out), [(0, 1), (1, 1), (2, 1)]);
        out.clear();
        bundle.on_link_up_test(1, 0, 1, &mut out).unwrap();
        bundle.on_link_up_test(1, 2, 1, &mut out).unwrap();
        assert!(!bundle.is_complete(), "no sending on a partial bundle");
        bundle.on_link_up_test(2, 1, 1, &mut out).unwrap();
        assert!(bundle.is_complete());
        assert_eq!(out, [BundleAction::Up]);
    }

    #[test]
    fn one_closed_link_tears_all_down_and_old_links_are_refused() {
        let mut bundle = Bundle::new(2, true, 100, BACKOFF, 0);
        let mut out = Vec::new();
        bundle.on_tick(0, &mut out);
        bundle.on_link_up_test(1, 0, 1, &mut out).unwrap();
        bundle.on_link_up_test(1, 1, 1, &mut out).unwrap();
        out.clear();
        bundle.on_link_closed(5, 1, 1, &mut out);
        assert_eq!(out, [BundleAction::Down, BundleAction::CloseAll]);
        assert!(!bundle.is_complete());
        assert_eq!(bundle.generation(), 2);
        assert_eq!(bundle.teardowns(), 1);
        // A half-closed link of generation 1 must not join generation 2.
        assert_eq!(
            bundle.on_link_up_test(6, 0, 1, &mut out),
            Err(LinkRefused::StaleGeneration {
                theirs: 1,
                current: 2
            })
        );
        // Redial after the backoff.
        out.clear();
        bundle.on_tick(14, &mut out);
        assert!(dials(&out).is_empty());
        bundle.on_tick(15, &mut out);
        assert_eq!(dials(&out), [(0, 2), (1, 2)]);
    }

    #[test]
    fn an_incomplete_bundle_is_torn_down_a_grace_after_its_first_link_and_backoff_grows() {
        let mut bundle = Bundle::new(2, true, 50, BACKOFF, 0);
        let mut out = Vec::new();
        bundle.on_tick(0, &mut out);
        bundle.on_link_up_test(1, 0, 1, &mut out).unwrap();
        out.clear();
        bundle.on_tick(51, &mut out);
        assert!(out.is_empty(), "still within the grace of the first link");
        bundle.on_tick(52, &mut out);
        assert_eq!(out, [BundleAction::CloseAll]);
        assert_eq!(bundle.next_deadline(), Some(62));
        // Again: the wait doubles.
        out.clear();
        bundle.on_tick(62, &mut out);
        bundle.on_link_up_test(63, 1, 2, &mut out).unwrap();
        bundle.on_tick(114, &mut out);
        assert_eq!(bundle.next_deadline(), Some(134));
    }

    #[test]
    fn an_acceptor_idle_for_long_takes_links_that_arrive_apart() {
        // Before: the grace ran from the last teardown, so after a long idle a lone link
        // was closed at once and two links 20 apart never formed a bundle.
        let mut bundle = Bundle::new(2, false, 100, BACKOFF, 0);
        let mut out = Vec::new();
        bundle.on_tick(10_000, &mut out);
        bundle.on_link_up_test(10_000, 0, 1, &mut out).unwrap();
        bundle.on_tick(10_001, &mut out);
        bundle.on_tick(10_019, &mut out);
        assert!(
            !out.contains(&BundleAction::CloseAll),
            "the lone link waits a grace"
        );
        bundle.on_link_up_test(10_020, 1, 1, &mut out).unwrap();
        assert!(bundle.is_complete());
    }

    #[test]
    fn backoff_starts_over_only_after_the_bundle_stayed_up_for_a_grace() {
        let mut bundle = Bundle::new(1, true, 100, BACKOFF, 0);
        let mut out = Vec::new();
        let mut now = 0;
        let mut waits = Vec::new();
        // A peer that completes the bundle and then drops it at once (a refusal after
        // the handshake): the backoff keeps growing instead of flapping at the base.
        for _ in 0..4 {
            bundle.on_tick(now, &mut out);
            let (_, generation) = dials(&out)[0];
            out.clear();
            bundle
                .on_link_up_test(now + 1, 0, generation, &mut out)
                .unwrap();
            bundle.on_link_closed(now + 2, 0, generation, &mut out);
            out.clear();
            let next = bundle.next_deadline().unwrap();
            waits.push(next - (now + 2));
            now = next;
        }
        assert_eq!(waits, [10, 20, 40, 80]);
        // A bundle that stayed up for a grace starts the backoff over.
        bundle.on_tick(now, &mut out);
        let (_, generation) = dials(&out)[0];
        out.clear();
        bundle
            .on_link_up_test(now + 1, 0, generation, &mut out)
            .unwrap();
        bundle.on_link_closed(now + 1 + 100, 0, generation, &mut out);
        assert_eq!(bundle.next_deadline(), Some(now + 101 + 10));
    }

    #[test]
    fn an_acceptor_starts_a_restarted_dialer_afresh_at_its_low_generation() {
        let mut bundle = Bundle::new(2, false, 100, BACKOFF, 0);
        let mut out = Vec::new();
        // Many teardowns of the old process's bundles: generation 41.
        bundle.on_link_up(1, 0, 41, 7, &mut out).unwrap();
        bundle.on_link_up(1, 1, 41, 7, &mut out).unwrap();
        assert!(bundle.is_complete());
        // A half-closed link of an older generation of that process is still refused.
        assert!(bundle.on_link_up(2, 0, 40, 7, &mut out).is_err());
        out.clear();
        // The dialer restarts (incarnation 8) and dials generation 1: taken at once.
        bundle.on_link_up(3, 0, 1, 8, &mut out).unwrap();
        assert_eq!(out, [BundleAction::Down, BundleAction::CloseAll]);
        bundle.on_link_up(3, 1, 1, 8, &mut out).unwrap();
        assert!(bundle.is_complete());
        assert_eq!(bundle.generation(), 1);
    }

    #[test]
    fn the_acceptor_follows_the_dialers_generation_and_never_dials() {
        let mut bundle = Bundle::new(2, false, 100, BACKOFF, 0);
        let mut out = Vec::new();
        bundle.on_tick(0, &mut out);
        assert!(out.is_empty());
        bundle.on_link_up_test(1, 0, 3, &mut out).unwrap();
        assert_eq!(bundle.generation(), 3);
        bundle.on_link_up_test(1, 1, 3, &mut out).unwrap();
        assert!(bundle.is_complete());
        out.clear();
        bundle.on_link_closed(2, 0, 3, &mut out);
        bundle.on_tick(500, &mut out);
        assert!(dials(&out).is_empty(), "the higher id waits to be dialed");
    }
}
