//! The run as a picture: throughput over time, and the latency percentile curves, in
//! one SVG file that any browser opens.

use std::path::Path;

use plotters::prelude::*;
use thiserror::Error;

use crate::report::Report;

/// Why a chart was not drawn.
#[derive(Debug, Error)]
pub enum ChartError {
    /// Only SVG is drawn (it needs no font or image library).
    #[error("charts are drawn as SVG; {0:?} does not end in .svg")]
    Format(String),
    /// Drawing or writing failed.
    #[error("drawing {path}: {message}")]
    Draw {
        /// The file.
        path: String,
        /// What the plotting library said.
        message: String,
    },
}

const WIDTH: u32 = 960;
const HEIGHT: u32 = 720;

/// Draws `report` to `path` (an `.svg` file).
///
/// # Errors
/// [`ChartError`].
pub fn draw(report: &Report, path: &Path) -> Result<(), ChartError> {
    if path.extension().and_then(|e| e.to_str()) != Some("svg") {
        return Err(ChartError::Format(path.display().to_string()));
    }
    let failed = |e: &dyn std::fmt::Display| ChartError::Draw {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed(&e))?;
    let (top, bottom) = root.split_vertically(HEIGHT / 2);
    throughput(report, &top).map_err(|e| failed(&e))?;
    percentiles(report, &bottom).map_err(|e| failed(&e))?;
    root.present().map_err(|e| failed(&e))?;
    Ok(())
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
type DrawResult = Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// Records per second, each second of the run, produced and consumed.
fn throughput(report: &Report, area: &Area<'_>) -> DrawResult {
    let seconds = report.timeline.last().map_or(1, |s| s.second).max(1);
    let top = report
        .timeline
        .iter()
        .map(|s| s.produced.max(s.consumed))
        .max()
        .unwrap_or(0)
        .max(1) as f64
        * 1.1;
    let title = format!(
        "Throughput (records/s), {} B records; warm-up {} s",
        report.workload.record_bytes, report.workload.warmup_seconds
    );
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(80)
        .build_cartesian_2d(0u64..seconds, 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("records/s")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    type Line = (&'static str, RGBColor, fn(&crate::report::Sample) -> u64);
    let lines: [Line; 2] = [
        ("produced", BLUE, |s| s.produced),
        ("consumed", RED, |s| s.consumed),
    ];
    for (label, color, value) in lines {
        if report.timeline.iter().all(|s| value(s) == 0) {
            continue;
        }
        let points = report.timeline.iter().map(|s| (s.second, value(s) as f64));
        line(&mut chart, label, color, points)?;
    }
    legend(&mut chart)
}

/// Draws one labelled line.
fn line<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    label: &str,
    color: RGBColor,
    points: impl Iterator<Item = (X::ValueType, Y::ValueType)>,
) -> DrawResult
where
    X: Ranged,
    Y: Ranged,
    X::ValueType: Clone + 'static,
    Y::ValueType: Clone + 'static,
{
    chart
        .draw_series(LineSeries::new(points, color.stroke_width(2)))?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    Ok(())
}

/// Draws the legend box of the labelled lines.
fn legend<'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
) -> DrawResult {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
}

/// "Nines" of a quantile: 0.9 is 1, 0.99 is 2; the x axis of a percentile curve.
fn nines(quantile: f64) -> f64 {
    -(1.0 - quantile).max(1e-6).log10()
}

/// "99.9%" for 3 nines: at most four decimals, no trailing zeros.
fn percentile_label(nines: f64) -> String {
    let percent = format!("{:.4}", 100.0 * (1.0 - 10f64.powf(-nines)));
    format!("{}%", percent.trim_end_matches('0').trim_end_matches('.'))
}

/// Latency (ms, log scale) against percentile, for acknowledgement and end to end.
fn percentiles(report: &Report, area: &Area<'_>) -> DrawResult {
    let curves = [
        ("produce ack", BLUE, &report.ack_curve),
        ("end to end", RED, &report.end_to_end_curve),
    ];
    let top_ms = curves
        .iter()
        .flat_map(|(_, _, c)| c.iter().map(|p| p.1))
        .max()
        .unwrap_or(1)
        .max(1) as f64
        / 1e3
        * 2.0;
    let bottom_ms = curves
        .iter()
        .flat_map(|(_, _, c)| c.iter().map(|p| p.1))
        .min()
        .unwrap_or(1)
        .max(1) as f64
        / 1e3
        / 2.0;
    let right = curves
        .iter()
        .flat_map(|(_, _, c)| c.iter().map(|p| nines(p.0)))
        .fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption("Latency by percentile (ms)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..right, (bottom_ms..top_ms).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("ms")
        .x_label_formatter(&|x| percentile_label(*x))
        .draw()?;
    for (label, color, curve) in curves {
        if curve.is_empty() {
            continue;
        }
        let points = curve
            .iter()
            .map(|&(q, us)| (nines(q), (us.max(1) as f64) / 1e3));
        line(&mut chart, label, color, points)?;
    }
    legend(&mut chart)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Recorder, Sample, CURVE_QUANTILES};
    use crate::workload::Preset;
    use std::time::Duration;

    #[test]
    fn percentile_labels_are_short() {
        assert_eq!(percentile_label(0.0), "0%");
        assert_eq!(percentile_label(1.0), "90%");
        assert_eq!(percentile_label(3.0), "99.9%");
        assert_eq!(percentile_label(5.0), "99.999%");
    }

    #[test]
    fn a_report_draws_as_svg_with_both_panels() {
        let mut recorder = Recorder::new();
        for us in 1..=2_000u64 {
            recorder.record(Duration::from_micros(us * 3));
        }
        let report = Report {
            target: String::new(),
            workload: Preset::named("end-to-end-1kb").unwrap(),
            produce: None,
            consume: None,
            ack_latency: Some(recorder.summary()),
            end_to_end_latency: Some(recorder.summary()),
            ack_curve: recorder.curve(CURVE_QUANTILES),
            end_to_end_curve: recorder.curve(CURVE_QUANTILES),
            errors: 0,
            target_rate: None,
            probed_max_rate: None,
            references: None,
            timeline: (1..=10)
                .map(|second| Sample {
                    second,
                    produced: 1_000 * second,
                    consumed: 900 * second,
                })
                .collect(),
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.svg");
        draw(&report, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
        for text in [
            "Throughput",
            "Latency by percentile",
            "produced",
            "end to end",
        ] {
            assert!(svg.contains(text), "{text} missing");
        }
        assert!(matches!(
            draw(&report, &dir.path().join("run.png")),
            Err(ChartError::Format(_))
        ));
    }
}
