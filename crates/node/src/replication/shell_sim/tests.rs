use super::*;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The seeds CI runs; `BRAID_SHELL_SIM_FROM`, `BRAID_SHELL_SIM_SEEDS` and
/// `BRAID_SHELL_SIM_JOBS` choose others (`scripts/sim-soak.sh --shell`).
#[test]
#[ignore = "the shell still fails some seeds (issue 24); run it by name"]
fn the_shell_keeps_every_acknowledged_record_and_the_same_log_on_every_member() {
    let from = env_u64("BRAID_SHELL_SIM_FROM", 1);
    let count = env_u64("BRAID_SHELL_SIM_SEEDS", 8);
    let jobs = env_u64("BRAID_SHELL_SIM_JOBS", 2) as usize;
    let started = std::time::Instant::now();
    let (failures, outcome, passed) = run_seeds(from, count, jobs);
    println!(
        "shell simulator: seeds {from}..{}: {passed} passed, {} failed in {:?}; {outcome:?}",
        from + count,
        failures.len(),
        started.elapsed()
    );
    for failure in &failures {
        println!("FAILED {failure}");
    }
    assert!(failures.is_empty(), "{} seeds failed", failures.len());
    assert!(
        outcome.records_acknowledged > 0,
        "the producers made progress"
    );
}

/// One seed with its faults and boots traced: `BRAID_SHELL_SIM_SEED=N`.
#[test]
#[ignore = "replays one seed: BRAID_SHELL_SIM_SEED=N BRAID_SHELL_SIM_TRACE=1"]
fn replay_one_seed() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BRAID_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let seed = env_u64("BRAID_SHELL_SIM_SEED", 1);
    match run_seed(seed) {
        Ok(outcome) => println!("seed {seed} passed: {outcome:?}"),
        Err(failure) => panic!("{failure}"),
    }
}
