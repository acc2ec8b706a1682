//! Figures of a run: latency percentiles from HDR histograms, throughput, ratios against
//! raw references measured in the same run, and the JSON report.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::workload::Workload;

/// The longest latency recorded exactly; longer ones are recorded as this.
const LATENCY_MAX_US: u64 = 3_600_000_000;

/// The quantiles of the latency percentile curve the report carries and the chart draws.
pub const CURVE_QUANTILES: &[f64] = &[
    0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999, 0.99999, 1.0,
];

/// Collects latencies in microseconds, at three significant digits.
#[derive(Debug, Clone)]
pub struct Recorder {
    histogram: Histogram<u64>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// An empty recorder for latencies from 1 µs to an hour.
    #[allow(clippy::expect_used)] // constant bounds that hdrhistogram accepts
    pub fn new() -> Self {
        Self {
            histogram: Histogram::new_with_bounds(1, LATENCY_MAX_US, 3)
                .expect("1 µs .. 1 h at 3 digits is a valid histogram"),
        }
    }

    /// Records one latency (clamped to 1 µs .. 1 h).
    pub fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.histogram.saturating_record(micros.max(1));
    }

    /// Records `count` latencies of the same value: one per record of a batch.
    pub fn record_n(&mut self, latency: Duration, count: u64) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let micros = micros.clamp(1, LATENCY_MAX_US);
        // Within bounds by the clamp, so this cannot fail.
        let _ = self.histogram.record_n(micros, count);
    }

    /// Adds another recorder's latencies (one per producer or consumer task).
    pub fn merge(&mut self, other: &Recorder) {
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.histogram.add(&other.histogram);
    }

    /// Latencies recorded.
    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// The percentiles the report shows.
    pub fn summary(&self) -> LatencySummary {
        let h = &self.histogram;
        LatencySummary {
            count: h.len(),
            p50_us: h.value_at_quantile(0.50),
            p90_us: h.value_at_quantile(0.90),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
        }
    }

    /// The latency at each of `quantiles`, for the percentile curve.
    pub fn curve(&self, quantiles: &[f64]) -> Vec<(f64, u64)> {
        quantiles
            .iter()
            .map(|q| (*q, self.histogram.value_at_quantile(*q)))
            .collect()
    }
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Latencies recorded.
    pub count: u64,
    /// Median.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// The largest.
    pub max_us: u64,
}

/// Records and bytes over a measured interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// Records.
    pub records: u64,
    /// Bytes of record values.
    pub bytes: u64,
    /// The measured interval in seconds.
    pub seconds: f64,
    /// Records per second.
    pub records_per_sec: f64,
    /// Megabytes (10^6 bytes) per second.
    pub mb_per_sec: f64,
}

impl Throughput {
    /// Throughput of `records` records and `bytes` bytes over `elapsed`.
    pub fn new(records: u64, bytes: u64, elapsed: Duration) -> Self {
        let seconds = elapsed.as_secs_f64();
        let per = |v: u64| {
            if seconds > 0.0 {
                v as f64 / seconds
            } else {
                0.0
            }
        };
        Self {
            records,
            bytes,
            seconds,
            records_per_sec: per(records),
            mb_per_sec: per(bytes) / 1e6,
        }
    }
}

/// Raw references measured in the same run, in MB/s.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct References {
    /// Sequential file write of the same volume.
    pub file_write_mb_per_sec: f64,
    /// One TCP stream over loopback.
    pub loopback_tcp_mb_per_sec: f64,
}

/// One second of the run, for the throughput-over-time chart.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the run (or, for a catch-up read, the read) began, warm-up
    /// included: the sample covers the second before.
    pub second: u64,
    /// Records acknowledged in this second.
    pub produced: u64,
    /// Records consumed in this second.
    pub consumed: u64,
}

/// The top-level fields of the JSON report, for scripts that check they have them all.
pub const REPORT_FIELDS: &[&str] = &[
    "target",
    "workload",
    "produce",
    "consume",
    "ack_latency",
    "end_to_end_latency",
    "ack_curve",
    "end_to_end_curve",
    "errors",
    "target_rate",
    "probed_max_rate",
    "references",
    "timeline",
];

/// Everything a run measured, with the workload that produced it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// What ran the workload: `embedded node`, `embedded cluster of N members`, or the
    /// addresses given (set by the caller; empty in older reports).
    #[serde(default)]
    pub target: String,
    /// The configuration, in full.
    pub workload: Workload,
    /// Produce throughput, if the run produced.
    pub produce: Option<Throughput>,
    /// Consume throughput, if the run consumed.
    pub consume: Option<Throughput>,
    /// Produce acknowledgement latency, from each batch's intended send time.
    pub ack_latency: Option<LatencySummary>,
    /// End-to-end latency, from the producer's stamp to the consumer.
    pub end_to_end_latency: Option<LatencySummary>,
    /// Acknowledgement latency at each of [`CURVE_QUANTILES`], as (quantile, µs).
    pub ack_curve: Vec<(f64, u64)>,
    /// End-to-end latency at each of [`CURVE_QUANTILES`], as (quantile, µs).
    pub end_to_end_curve: Vec<(f64, u64)>,
    /// Errors seen (failed produces, failed fetches, bad records).
    pub errors: u64,
    /// Records/s the producers were paced at, all together; `None`: unpaced.
    pub target_rate: Option<u64>,
    /// The unpaced rate the probe measured, for a rate given as a percentage of it.
    pub probed_max_rate: Option<u64>,
    /// Raw references, with `--reference`.
    pub references: Option<References>,
    /// Per-second throughput.
    pub timeline: Vec<Sample>,
}

impl Report {
    /// Produce and consume MB/s as fractions of the loopback TCP reference.
    pub fn loopback_ratios(&self) -> Option<(Option<f64>, Option<f64>)> {
        let reference = self.references?.loopback_tcp_mb_per_sec;
        if reference <= 0.0 {
            return None;
        }
        Some((
            self.produce.map(|t| t.mb_per_sec / reference),
            self.consume.map(|t| t.mb_per_sec / reference),
        ))
    }

    /// The report as pretty JSON.
    ///
    /// # Errors
    /// Only if serialization fails, which plain data does not.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }

    /// A report read back from JSON (for comparisons between runs).
    ///
    /// # Errors
    /// If `json` is not a report.
    pub fn from_json(json: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Preset;

    #[test]
    fn percentiles_of_a_known_distribution() {
        let mut recorder = Recorder::new();
        for micros in 1..=10_000u64 {
            recorder.record(Duration::from_micros(micros));
        }
        let s = recorder.summary();
        assert_eq!(s.count, 10_000);
        // Three significant digits: within 0.1%.
        let near = |got: u64, want: u64| (got as f64 / want as f64 - 1.0).abs() < 0.001;
        assert!(near(s.p50_us, 5_000), "{s:?}");
        assert!(near(s.p90_us, 9_000), "{s:?}");
        assert!(near(s.p99_us, 9_900), "{s:?}");
        assert!(near(s.p999_us, 9_990), "{s:?}");
        assert!(near(s.max_us, 10_000), "{s:?}");
    }

    #[test]
    fn batches_merges_and_out_of_range_values_count() {
        let mut a = Recorder::new();
        a.record_n(Duration::from_millis(2), 1_000);
        a.record(Duration::ZERO);
        let mut b = Recorder::new();
        b.record(Duration::from_secs(100_000));
        a.merge(&b);
        assert_eq!(a.count(), 1_002);
        assert_eq!(a.summary().p50_us / 10, 200);
        assert!(a.summary().max_us >= LATENCY_MAX_US);
        let curve = a.curve(&[0.5, 0.999]);
        assert_eq!(curve.len(), 2);
        assert!(curve[0].1 <= curve[1].1);
    }

    #[test]
    fn throughput_and_ratios() {
        let t = Throughput::new(1_000_000, 1_024_000_000, Duration::from_secs(2));
        assert_eq!(t.records_per_sec, 500_000.0);
        assert_eq!(t.mb_per_sec, 512.0);
        assert_eq!(Throughput::new(5, 5, Duration::ZERO).mb_per_sec, 0.0);
        let report = Report {
            target: String::new(),
            workload: Preset::named("throughput-1kb").unwrap(),
            produce: Some(t),
            consume: None,
            ack_latency: None,
            end_to_end_latency: None,
            ack_curve: Vec::new(),
            end_to_end_curve: Vec::new(),
            errors: 0,
            target_rate: None,
            probed_max_rate: None,
            references: Some(References {
                file_write_mb_per_sec: 1_000.0,
                loopback_tcp_mb_per_sec: 1_024.0,
            }),
            timeline: Vec::new(),
        };
        assert_eq!(report.loopback_ratios(), Some((Some(0.5), None)));
    }

    #[test]
    fn the_json_report_holds_every_field_and_reads_back() {
        let mut recorder = Recorder::new();
        recorder.record(Duration::from_micros(750));
        let report = Report {
            target: String::new(),
            workload: Preset::named("fanout").unwrap(),
            produce: Some(Throughput::new(10, 10_240, Duration::from_secs(1))),
            consume: Some(Throughput::new(40, 40_960, Duration::from_secs(1))),
            ack_latency: Some(recorder.summary()),
            end_to_end_latency: Some(recorder.summary()),
            ack_curve: recorder.curve(CURVE_QUANTILES),
            end_to_end_curve: recorder.curve(CURVE_QUANTILES),
            errors: 3,
            target_rate: Some(10),
            probed_max_rate: Some(20),
            references: None,
            timeline: vec![Sample {
                second: 0,
                produced: 10,
                consumed: 40,
            }],
        };
        let json = report.to_json().unwrap();
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        for field in REPORT_FIELDS {
            assert!(value.get(field).is_some(), "{field} missing from {json}");
        }
        // And the list names every field there is.
        assert_eq!(value.as_object().unwrap().len(), REPORT_FIELDS.len());
        assert_eq!(value["workload"]["mode"], "produce-consume");
        assert_eq!(value["ack_latency"]["p99_us"], 750);
        assert_eq!(Report::from_json(&json).unwrap(), report);
    }
}
