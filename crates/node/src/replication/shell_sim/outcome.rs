//! What a run did, counted.

/// What a run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) records_acknowledged: u64,
    pub(crate) produces_failed: u64,
    pub(crate) kills: u64,
    pub(crate) power_losses: u64,
    pub(crate) cuts: u64,
    pub(crate) frames_lost: u64,
    /// Checks of what a member would serve that stopped before a damaged batch.
    pub(crate) reads_refused: u64,
    /// Files damaged at rest: a bit flipped, or a page zeroed.
    pub(crate) damaged_files: u64,
    /// Partitions' files put to sleep while idle, and woken again (counted at each
    /// member's crashes and clean restart).
    pub(crate) files_slept: u64,
    pub(crate) files_woken: u64,
    /// Partitions whose descriptors were let go because more partitions used their
    /// files than the run's budget ([`super::Shape::open_budget`]).
    pub(crate) files_released_over_budget: u64,
    /// Partitions opened again because their files changed while asleep.
    pub(crate) reopened: u64,
    /// Times a member ran out of file descriptors, and opens refused one meanwhile.
    pub(crate) descriptors_out: u64,
    pub(crate) opens_refused: u64,
    pub(crate) ticks_to_converge: u64,
    /// Records in each member's log at the end (the same in all).
    pub(crate) records_stored: u64,
    /// Streams whose creation the metadata group acknowledged, and the streams every
    /// member holds at the end (at least as many: an unanswered proposal may commit).
    pub(crate) streams_acknowledged: u64,
    pub(crate) streams_stored: u64,
    /// Client sessions' requests sent again after a failure, those of them answered
    /// with offsets, and those answered `DuplicateRequest` (stored before).
    pub(crate) session_requests_resent: u64,
    pub(crate) resent_requests_acknowledged: u64,
    pub(crate) duplicates_refused: u64,
    /// Client sessions registered through the metadata group and answered.
    pub(crate) sessions_registered: u64,
    /// Producers' sessions ended and retired: every copy proven free of them by
    /// barriers ([`super::retire`]).
    pub(crate) sessions_retired: u64,
    /// Retirement barriers queued on a primary.
    pub(crate) barriers_queued: u64,
    /// FinalizeSession ops the metadata client had acknowledged.
    pub(crate) finalizes_acknowledged: u64,
    /// Consumer-group joins the metadata client had answered.
    pub(crate) members_joined: u64,
}

impl Outcome {
    /// Adds another run's counts.
    pub(crate) fn add(&mut self, other: &Self) {
        let Self {
            records_acknowledged,
            produces_failed,
            kills,
            power_losses,
            cuts,
            frames_lost,
            reads_refused,
            damaged_files,
            files_slept,
            files_woken,
            files_released_over_budget,
            reopened,
            descriptors_out,
            opens_refused,
            ticks_to_converge,
            records_stored,
            streams_acknowledged,
            streams_stored,
            session_requests_resent,
            resent_requests_acknowledged,
            duplicates_refused,
            sessions_registered,
            sessions_retired,
            barriers_queued,
            finalizes_acknowledged,
            members_joined,
        } = other;
        self.records_acknowledged += records_acknowledged;
        self.produces_failed += produces_failed;
        self.kills += kills;
        self.power_losses += power_losses;
        self.cuts += cuts;
        self.frames_lost += frames_lost;
        self.reads_refused += reads_refused;
        self.damaged_files += damaged_files;
        self.files_slept += files_slept;
        self.files_woken += files_woken;
        self.files_released_over_budget += files_released_over_budget;
        self.reopened += reopened;
        self.descriptors_out += descriptors_out;
        self.opens_refused += opens_refused;
        self.ticks_to_converge += ticks_to_converge;
        self.records_stored += records_stored;
        self.streams_acknowledged += streams_acknowledged;
        self.streams_stored += streams_stored;
        self.session_requests_resent += session_requests_resent;
        self.resent_requests_acknowledged += resent_requests_acknowledged;
        self.duplicates_refused += duplicates_refused;
        self.sessions_registered += sessions_registered;
        self.sessions_retired += sessions_retired;
        self.barriers_queued += barriers_queued;
        self.finalizes_acknowledged += finalizes_acknowledged;
        self.members_joined += members_joined;
    }
}
