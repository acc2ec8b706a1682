//! Running seeds, one or many on threads.

use braid_storage::disk::hook;

use super::{Failure, Outcome, Run};

/// What every seed of a run shares, beside its own draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Variant {
    /// One member's files damaged at rest after some of its power losses.
    pub(crate) damage: bool,
    /// Members of every group: 3 or 5.
    pub(crate) members: u8,
    /// Crashes, cuts, frames lost and doubled, times this.
    pub(crate) fault_scale: u64,
    /// With damage: a page written to the wrong place is one of the damages at rest
    /// (off by default, so that the seeds' draws without it stay as they were).
    pub(crate) misdirected: bool,
    /// With damage: a page that every read fails on (EIO) until it is written again
    /// (a latent sector error) is one of the damages at rest (off by default, as
    /// `misdirected`).
    pub(crate) latent: bool,
    /// With damage: the damaged member's files of a sleeping partition are damaged,
    /// or one removed, while it runs ([`super::Shape::asleep_damage_per_10k`]).
    pub(crate) asleep: bool,
    /// One member at a time runs out of file descriptors for a while: every open and
    /// creation of its partitions' files is refused EMFILE ([`super::Shape::descriptors_out_per_10k`]).
    pub(crate) descriptors: bool,
}

impl Variant {
    /// Three members, the seed's own faults.
    pub(crate) fn plain(damage: bool) -> Self {
        Self {
            damage,
            members: 3,
            fault_scale: 1,
            misdirected: false,
            latent: false,
            asleep: false,
            descriptors: false,
        }
    }
}

/// Runs `seed` as `variant` says; a panic (a broken assertion in the shell or the
/// core) is its failure.
pub(crate) fn run_seed(seed: u64, variant: Variant) -> Result<Outcome, Failure> {
    let result = std::panic::catch_unwind(|| Run::new(seed, variant)?.run());
    result.unwrap_or_else(|panic| {
        let _ = hook::take();
        Err(Failure {
            seed,
            tick: 0,
            what: format!("panicked: {}", braid_sim::panic_message(panic.as_ref())),
        })
    })
}

/// Runs seeds `from..from + count` on `jobs` threads as `variant` says; returns the
/// failures, the outcomes summed, and the seeds passed.
pub(crate) fn run_seeds(
    from: u64,
    count: u64,
    jobs: usize,
    variant: Variant,
) -> (Vec<Failure>, Outcome, u64) {
    let next = std::sync::atomic::AtomicU64::new(from);
    // A seed that runs for long (a message storm, a loop) is named while it runs.
    let verbose = std::env::var_os("BRAID_SHELL_SIM_VERBOSE").is_some();
    let results = std::sync::Mutex::new((Vec::new(), Outcome::default(), 0u64));
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if seed >= from + count {
                    return;
                }
                if verbose {
                    eprintln!("seed {seed} starts");
                }
                let started = std::time::Instant::now();
                let result = run_seed(seed, variant);
                if verbose {
                    let passed = if result.is_ok() { "passed" } else { "FAILED" };
                    eprintln!("seed {seed} {passed} in {:?}", started.elapsed());
                }
                let Ok(mut all) = results.lock() else {
                    return;
                };
                match result {
                    Ok(outcome) => {
                        all.2 += 1;
                        all.1.add(&outcome);
                    }
                    Err(failure) => all.0.push(failure),
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
