//! `cargo run -p braid-sim -- --seeds 1000` runs many seeds and prints a summary;
//! `--seed S [--trace]` replays one run exactly.

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
    let mut ticks = Vec::new();
    let mut failures = Vec::new();
    let mut total = Outcome::default();
    for seed in first..first + seeds {
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
    }
    ticks.sort_unstable();
    let median = ticks.get(ticks.len() / 2).copied().unwrap_or(0);
    let max = ticks.last().copied().unwrap_or(0);
    println!(
        "{} seeds from {first}: {} passed, {} failed; {} ops committed; ticks to converge: median {median}, max {max}",
        seeds,
        ticks.len(),
        failures.len(),
        total.ops_committed,
    );
    println!("faults: {}", total.fault_summary());
    if !failures.is_empty() {
        eprintln!("failed seeds: {failures:?}");
        std::process::exit(1);
    }
}
