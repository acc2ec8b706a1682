//! `cargo run -p braid-sim --release -- --seeds 1000 [--from S] [--jobs N]` runs many
//! seeds (on N threads) and prints a summary; `--seed S [--trace]` replays one run
//! exactly.

use braid_sim::{run_seed, Outcome};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let trace = args.iter().any(|a| a == "--trace");
    if let Some(seed) = value("--seed") {
        match run_seed(seed, trace) {
            Ok(outcome) => println!("seed {seed}: ok, {outcome:?}"),
            Err(failure) => {
                eprintln!("{failure}");
                std::process::exit(1);
            }
        }
        return;
    }
    let seeds = value("--seeds").unwrap_or(100);
    let first = value("--from").unwrap_or(1);
    let jobs = value("--jobs").unwrap_or(1).clamp(1, 64);
    let started = std::time::Instant::now();
    // Seed i goes to job i % jobs; each job sums its own outcomes.
    let results: Vec<(Outcome, Vec<u64>, Vec<u64>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..jobs)
            .map(|job| {
                scope.spawn(move || {
                    let mut total = Outcome::default();
                    let mut ticks = Vec::new();
                    let mut failures = Vec::new();
                    let mut seed = first + job;
                    while seed < first + seeds {
                        match run_seed(seed, false) {
                            Ok(outcome) => {
                                ticks.push(outcome.ticks_to_converge);
                                total.add(&outcome);
                            }
                            Err(failure) => {
                                eprintln!("{failure}");
                                failures.push(seed);
                            }
                        }
                        seed += jobs;
                    }
                    (total, ticks, failures)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mut total = Outcome::default();
    let mut ticks = Vec::new();
    let mut failures = Vec::new();
    for (outcome, job_ticks, job_failures) in results {
        total.add(&outcome);
        ticks.extend(job_ticks);
        failures.extend(job_failures);
    }
    failures.sort_unstable();
    ticks.sort_unstable();
    let median = ticks.get(ticks.len() / 2).copied().unwrap_or(0);
    let max = ticks.last().copied().unwrap_or(0);
    println!(
        "{} seeds from {first}: {} passed, {} failed; {} ops committed; ticks to converge: median {median}, max {max}; {:.0} s on {jobs} threads",
        seeds,
        ticks.len(),
        failures.len(),
        total.ops_committed,
        started.elapsed().as_secs_f64(),
    );
    println!("faults: {}", total.fault_summary());
    if !failures.is_empty() || ticks.len() as u64 != seeds {
        eprintln!("failed seeds: {failures:?}");
        std::process::exit(1);
    }
}
