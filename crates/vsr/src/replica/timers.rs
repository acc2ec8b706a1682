//! Timers and quiescence: the deadline table, what fires on a tick, what is resent,
//! and when an idle group drops its timers.

use super::*;

impl<S: StateMachine> Replica<S> {
    /// Whether nothing is in flight: everything prepared is committed and applied,
    /// nothing is missing, and the view is durable.
    pub fn is_idle(&self) -> bool {
        self.status() == Status::Normal
            && self.op == self.commit_max
            && self.commit_min == self.commit_max
            && self.wanted.is_empty()
            && self.faulty.is_empty()
            && self.view_durable()
            && !self.acks_owed
            && self.prepare_oks.is_empty()
            && (!self.is_primary() || self.start_view_sent || self.view == 0)
            && self.journal.values().all(|e| e.durable && e.canonical)
    }

    /// Idle, and sure its peers know it: a primary has sent its final commit a few
    /// times; a backup has heard that commit reach its op.
    pub(super) fn may_quiesce(&self) -> bool {
        self.config.quiesce
            && !self.watching
            && self.is_idle()
            // A replica restarted untrusted asks its peers for their views on its retry
            // timer until it knows what it needs: quiet before, it never asked again
            // and stayed untrusted for ever (an outside review of issue 24). One that
            // kept its views stays awake until it trusts its journal again.
            && self.rejoin.as_ref().is_none_or(|r| r.views_lost && r.trust_from.is_some())
            && if self.is_primary() {
                self.idle_heartbeats >= QUIET_AFTER_HEARTBEATS
            } else {
                self.heard_commit >= self.op
            }
    }

    /// After each input: a quiescing idle replica drops its timers and compacts its
    /// journal to the commit anchor; a busy one has the timers its status needs.
    pub(super) fn settle_timers(&mut self) {
        if self.may_quiesce() {
            self.deadlines = Deadlines::NONE;
            // What a busy spell boxed and emptied goes: an idle group keeps pointers.
            self.faulty.settle();
            self.wanted.settle();
            self.prepare_oks.settle();
            self.startup.settle();
            if self.journal.len() > 1 {
                let anchor = self.journal.get(&self.commit_min).map(|e| e.header);
                if let Some(header) = anchor {
                    self.journal.clear();
                    self.journal.insert(header.op, Entry::anchor(header));
                    self.compacted_through = header.op;
                }
            }
            return;
        }
        let needs = |timer: Timer, replica: &Self| replica.deadlines.get(timer).is_none();
        if needs(Timer::Retry, self) {
            self.arm(Timer::Retry, self.config.retry_ticks);
        }
        if self.is_primary() {
            if needs(Timer::Heartbeat, self) {
                self.arm(Timer::Heartbeat, self.config.heartbeat_ticks);
            }
            self.settle_step_down();
        } else if needs(Timer::ViewChange, self) {
            let timeout = self.view_change_timeout();
            self.arm(Timer::ViewChange, timeout);
        }
    }

    /// A primary's step-down deadline: set while ops are in flight in a group of more
    /// than one, cleared by each commit (`try_commit`; so set again from there) and
    /// when everything is committed.
    fn settle_step_down(&mut self) {
        if self.config.replica_count == 1 || self.op == self.commit_max {
            self.deadlines.clear(Timer::ViewChange);
        } else if self.deadlines.get(Timer::ViewChange).is_none() {
            self.arm(Timer::ViewChange, 2 * self.config.view_change_ticks);
        }
    }

    pub(super) fn arm(&mut self, timer: Timer, ticks: u64) {
        self.deadlines.set(timer, self.now + ticks.max(1));
    }

    pub(super) fn view_change_timeout(&mut self) -> u64 {
        let base = self.config.view_change_ticks;
        base + splitmix(&mut self.prng) % base.max(1)
    }

    pub(super) fn arm_status_timers(&mut self) {
        self.deadlines = Deadlines::NONE;
        if self.is_primary() {
            self.arm(Timer::Heartbeat, self.config.heartbeat_ticks);
        }
        let timeout = self.view_change_timeout();
        if !self.is_primary() {
            self.arm(Timer::ViewChange, timeout);
        }
        self.arm(Timer::Retry, self.config.retry_ticks);
    }

    pub(super) fn on_tick(&mut self, out: &mut Vec<Output>) {
        let now = self.now;
        let due = |d: Option<u64>| d.is_some_and(|d| d <= now);
        if due(self.deadlines.get(Timer::Heartbeat)) {
            self.arm(Timer::Heartbeat, self.config.heartbeat_ticks);
            if self.is_primary() {
                self.send_commit(out);
                if self.is_idle() {
                    self.idle_heartbeats = self.idle_heartbeats.saturating_add(1);
                } else {
                    self.idle_heartbeats = 0;
                }
            }
        }
        if due(self.deadlines.get(Timer::ViewChange)) {
            let timeout = self.view_change_timeout();
            self.arm(Timer::ViewChange, timeout);
            match self.status() {
                Status::Normal if !self.is_primary() => self.start_view_change(self.view + 1, out),
                // Its prepares commit nothing: it cannot reach a quorum, or the quorum
                // moved on without it. Leading on would hold its clients forever.
                Status::Normal if self.op > self.commit_max => {
                    self.step_downs = self.step_downs.saturating_add(1);
                    self.start_view_change(self.view + 1, out);
                }
                Status::ViewChange => self.start_view_change(self.view + 1, out),
                // Nobody answered with a StartView of our view (its primary may be us,
                // or that view never started): move the group to a newer one.
                Status::Recovering => self.start_view_change(self.view + 1, out),
                _ => {}
            }
        }
        if due(self.deadlines.get(Timer::Retry)) {
            self.arm(Timer::Retry, self.config.retry_ticks);
            self.retry(out);
            self.ask_views(out);
        }
    }

    /// Resends whatever waits for an answer.
    pub(super) fn retry(&mut self, out: &mut Vec<Output>) {
        match self.status() {
            Status::Normal if self.is_primary() => {
                // Prepares not yet acknowledged by a quorum.
                let waiting: Vec<u64> = ((self.commit_max + 1)..=self.op).collect();
                for op in waiting {
                    if let Some(prepare) = self.prepare_at(op) {
                        let acked = self.prepare_oks.get(&op).cloned().unwrap_or_default();
                        for to in self.others() {
                            if !acked.contains(&to) {
                                out.push(Output::Send {
                                    to,
                                    message: Message::Prepare(prepare.clone()),
                                });
                            }
                        }
                    }
                }
                self.repair(out);
            }
            Status::Normal => self.repair(out),
            Status::ViewChange => {
                self.send_start_view_change(out);
                if self.view_change().is_some_and(|v| v.do_view_change_sent) {
                    self.send_do_view_change(out);
                }
                if self.view_change().is_some_and(|v| v.start_view_pending) {
                    self.repair_view_change(out);
                }
            }
            Status::Recovering => {
                let to = self.primary_of(self.view);
                let message = Message::RequestStartView {
                    view: self.view,
                    from: self.config.replica,
                };
                if to == self.config.replica {
                    self.send_to_others(message, out);
                } else {
                    out.push(Output::Send { to, message });
                }
            }
        }
    }
}

/// When each timer fires, a tick or none: `u64::MAX` stands for none (no tick reaches
/// it), so the table is 24 bytes, not the 48 of `Option`s, in every idle group.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadlines([u64; TIMERS]);

impl Deadlines {
    pub(super) const NONE: Self = Self([u64::MAX; TIMERS]);

    pub(super) fn get(&self, timer: Timer) -> Option<u64> {
        Some(self.0[timer as usize]).filter(|tick| *tick != u64::MAX)
    }

    pub(super) fn set(&mut self, timer: Timer, tick: u64) {
        self.0[timer as usize] = tick.min(u64::MAX - 1);
    }

    pub(super) fn clear(&mut self, timer: Timer) {
        self.0[timer as usize] = u64::MAX;
    }

    /// The earliest tick at which a timer fires.
    pub(super) fn earliest(&self) -> Option<u64> {
        self.0.iter().copied().filter(|t| *t != u64::MAX).min()
    }
}
