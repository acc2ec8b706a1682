//! `braid bench` as users run it: the real binary, an embedded node, a JSON report.
//! Short runs of each mode check the counts; a 5-second paced run checks the rate.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use braid_bench::Report;

const BRAID: &str = env!("CARGO_BIN_EXE_braid");

/// A short run: 3,000 records of 256 bytes in batches of 100, no warm-up.
const SMALL: [&str; 8] = [
    "--records",
    "3000",
    "--warmup",
    "0",
    "--record-size",
    "256",
    "--batch",
    "100",
];

/// Asserts the embedded nodes' directories under `dir` were removed.
fn assert_no_directory_left(dir: &Path) {
    let left = std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().is_dir())
        .count();
    assert_eq!(left, 0, "the embedded nodes' data directories are removed");
}

/// Runs `braid bench ARGS --embedded --json FILE` and reads the report back.
fn bench(dir: &Path, name: &str, args: &[&str]) -> (Report, serde_json::Value, String) {
    let json = dir.join(format!("{name}.json"));
    let output = Command::new(BRAID)
        .arg("bench")
        .args(args)
        .arg("--embedded")
        .arg("--data-dir")
        .arg(dir)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "braid bench {args:?} failed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(&json).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    (Report::from_json(&text).unwrap(), value, stdout)
}

#[test]
fn each_mode_consumes_every_produced_record_and_reports_every_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[&str], u64); 4] = [
        ("throughput-1kb", &[], 0),
        ("consume-1kb", &[], 1),
        // Paced, so the consumer waits in its long poll for each batch.
        (
            "end-to-end-1kb",
            &["--partitions", "3", "--keys", "500", "--rate", "6000"],
            1,
        ),
        // Four groups of one, and a group of two sharing partitions: every group reads
        // everything once.
        ("fanout", &["--consumers", "6", "--groups", "4"], 4),
    ];
    for (preset, extra, units) in cases {
        let mut args = vec![preset];
        args.extend_from_slice(&SMALL);
        args.extend_from_slice(extra);
        let (report, value, stdout) = bench(dir.path(), preset, &args);
        for field in braid_bench::REPORT_FIELDS {
            assert!(value.get(field).is_some(), "{preset}: {field} missing");
        }
        assert_eq!(report.errors, 0, "{preset}");
        let produce = report.produce.expect("every mode produces");
        assert_eq!(produce.records, 3_000, "{preset}");
        assert_eq!(produce.bytes, 3_000 * 256, "{preset}");
        assert_eq!(report.ack_latency.unwrap().count, 3_000, "{preset}");
        match report.consume {
            Some(consume) => assert_eq!(consume.records, 3_000 * units, "{preset}"),
            None => assert_eq!(units, 0, "{preset}"),
        }
        if let Some(e2e) = report.end_to_end_latency {
            assert_eq!(e2e.count, 3_000 * units, "{preset}");
            assert!(e2e.p50_us <= e2e.p99_us && e2e.p99_us <= e2e.max_us);
            // A record crosses two sockets and a disk write: 1 µs is a clock taken
            // before the data arrived.
            assert!(e2e.p50_us > 1, "{preset}: end-to-end p50 {} µs", e2e.p50_us);
        }
        assert!(
            stdout.contains("THROUGHPUT"),
            "{preset}: no table in\n{stdout}"
        );
    }
    assert_no_directory_left(dir.path());
}

/// `--embedded --members 3`: the run goes to a 3-node cluster in the bench's process,
/// over partitions whose primaries are spread over the members; everything produced
/// is acknowledged by a quorum and read back.
#[test]
fn an_embedded_cluster_of_three_takes_and_serves_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["consume-1kb", "--members", "3", "--partitions", "3"];
    args.extend_from_slice(&SMALL);
    let (report, _, stdout) = bench(dir.path(), "cluster", &args);
    assert_eq!(report.target, "embedded cluster of 3 members");
    assert!(
        stdout.contains("against embedded cluster of 3 members"),
        "{stdout}"
    );
    assert_eq!(report.errors, 0);
    assert_eq!(report.produce.unwrap().records, 3_000);
    assert_eq!(report.consume.unwrap().records, 3_000);
    assert_no_directory_left(dir.path());
}

#[test]
fn a_paced_run_holds_its_rate_within_five_percent() {
    let dir = tempfile::tempdir().unwrap();
    let (report, _, _) = bench(
        dir.path(),
        "paced",
        &[
            "throughput-1kb",
            "--rate",
            "4000",
            "--duration",
            "5",
            "--warmup",
            "0",
            "--batch",
            "20",
            "--record-size",
            "128",
        ],
    );
    assert_eq!(report.target_rate, Some(4_000));
    let produce = report.produce.unwrap();
    let achieved = produce.records_per_sec;
    assert!(
        (achieved / 4_000.0 - 1.0).abs() < 0.05,
        "achieved {achieved:.0} records/s over {:.2} s",
        produce.seconds
    );
    // The five seconds are in the timeline, each near the rate.
    assert!(report.timeline.len() >= 4, "{:?}", report.timeline);
}

#[test]
fn bad_options_are_refused_with_the_value() {
    for (args, expect) in [
        (&["bench", "no-such-preset"][..], "no preset named"),
        (
            &["bench", "throughput-1kb", "--rate", "fast"],
            "is not a rate",
        ),
        (
            &["bench", "throughput-1kb", "--fsync", "sometimes"],
            "not an fsync policy",
        ),
        (
            &["bench", "throughput-1kb", "--record-size", "8"],
            "cannot hold",
        ),
        (
            &["bench", "throughput-1kb", "--rate", "150%"],
            "outside 1..=100",
        ),
    ] {
        let output = Command::new(BRAID).args(args).output().unwrap();
        assert!(!output.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
    }
    let list = Command::new(BRAID)
        .args(["bench", "--list"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&list.stdout);
    for preset in braid_bench::PRESETS {
        assert!(stdout.contains(preset.name), "{stdout}");
    }
}

#[test]
fn a_percentage_of_the_maximum_is_paced_at_that_share_of_the_probe() {
    let dir = tempfile::tempdir().unwrap();
    let (report, _, stdout) = bench(
        dir.path(),
        "latency",
        &[
            "latency-1kb",
            "--duration",
            "2",
            "--warmup",
            "0",
            "--record-size",
            "128",
            "--batch",
            "50",
        ],
    );
    let max = report.probed_max_rate.expect("the probe ran");
    assert!(max > 0);
    assert_eq!(report.target_rate, Some(max / 2));
    let produce = report.produce.unwrap();
    assert!(produce.records > 0 && report.errors == 0);
    assert!(stdout.contains("paced at"), "{stdout}");
}
