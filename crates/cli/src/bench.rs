//! `braid bench`: run a preset workload (with overrides) against a node or an embedded
//! one, show live progress, and print, save and chart the figures.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use braid_bench::{
    chart, reference, Counters, EmbeddedNode, Fsync, LatencySummary, Mode, Phase, Preset, Rate,
    Report, RunOptions, Stop, Throughput, Workload, PRESETS,
};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::table;

#[derive(clap::Args, Debug)]
pub(crate) struct BenchArgs {
    /// The preset to run (`--list` shows them); the options below override it.
    #[arg(required_unless_present = "list")]
    preset: Option<String>,
    /// List the presets and exit.
    #[arg(long)]
    list: bool,
    /// Start a node in this process on a temporary directory (removed afterwards)
    /// instead of using --addr.
    #[arg(long)]
    embedded: bool,
    /// With --embedded: start a cluster of this many members in this process (on
    /// loopback ports; every partition replicated on all of them) instead of one node.
    #[arg(long, default_value_t = 1, requires = "embedded",
          value_parser = clap::value_parser!(u8).range(1..=i64::from(braid_bench::EMBEDDED_MEMBERS_MAX)))]
    members: u8,
    /// Where --embedded puts its temporary directory and --reference its scratch file
    /// [default: the system's temporary directory].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Also measure raw sequential file write and loopback TCP in this run, and show
    /// Braid's figures as ratios of them.
    #[arg(long)]
    reference: bool,
    /// MiB each reference moves.
    #[arg(long, default_value_t = 1024)]
    reference_mib: u64,
    /// Draw throughput over time and the latency percentiles to this SVG file.
    #[arg(long)]
    chart: Option<PathBuf>,
    /// Keep the run's stream (and its data) on the node afterwards.
    #[arg(long)]
    keep: bool,
    /// Run this many seconds after the warm-up.
    #[arg(long, conflicts_with = "records")]
    duration: Option<u64>,
    /// Stop after this many records in total.
    #[arg(long)]
    records: Option<u64>,
    /// Seconds run before the figures start.
    #[arg(long)]
    warmup: Option<u64>,
    /// produce, consume (catch-up read of data written first) or produce-consume.
    #[arg(long, value_parser = parse_mode)]
    mode: Option<Mode>,
    /// Producer connections.
    #[arg(long)]
    producers: Option<u32>,
    /// Consumers in total.
    #[arg(long)]
    consumers: Option<u32>,
    /// Consumer groups the consumers are spread over (0: plain consumers that each
    /// read everything).
    #[arg(long)]
    groups: Option<u32>,
    /// Topics.
    #[arg(long)]
    topics: Option<u32>,
    /// Partitions per topic.
    #[arg(long)]
    partitions: Option<u32>,
    /// Bytes per record value (at least 16: the stamp).
    #[arg(long)]
    record_size: Option<u32>,
    /// Records per produce batch.
    #[arg(long)]
    batch: Option<u32>,
    /// Milliseconds a partition's batch may wait to fill.
    #[arg(long)]
    linger_ms: Option<u32>,
    /// Batches each producer keeps in flight.
    #[arg(long)]
    in_flight: Option<u32>,
    /// Distinct keys, drawn uniformly (0: keyless records).
    #[arg(long)]
    keys: Option<u64>,
    /// Records/s for all producers together: max, a number, or a percentage of the
    /// maximum measured by a short probe first (50%).
    #[arg(long, value_parser = parse_rate)]
    rate: Option<Rate>,
    /// fsync policy of the run's topics: never, always or interval:MS.
    #[arg(long, value_parser = parse_fsync)]
    fsync: Option<Fsync>,
    /// Each producer holds a client session and numbers its batches, as the SDK's
    /// idempotent producer does.
    #[arg(long)]
    sessions: bool,
    /// With the `retirement` experiment: the sessions that write to every partition
    /// and then end, per pass.
    #[arg(long, default_value_t = 32)]
    retire_sessions: u32,
    /// With the `retirement` experiment on a running cluster (--addr, not
    /// --embedded): each member's HTTP address, in the order of --addr, comma-separated
    /// (its figures come from the members' `/metrics`).
    #[arg(long, value_delimiter = ',')]
    http_addrs: Vec<String>,
}

fn parse_mode(value: &str) -> Result<Mode, String> {
    match value {
        "produce" => Ok(Mode::Produce),
        "consume" => Ok(Mode::Consume),
        "produce-consume" | "both" => Ok(Mode::ProduceConsume),
        other => Err(format!(
            "{other:?} is not a mode: produce, consume or produce-consume"
        )),
    }
}

fn parse_rate(value: &str) -> Result<Rate, String> {
    if value == "max" {
        return Ok(Rate::Max);
    }
    if let Some(percent) = value.strip_suffix('%') {
        return percent
            .parse()
            .map(Rate::PercentOfMax)
            .map_err(|_| format!("{value:?} is not a percentage of the maximum (e.g. 50%)"));
    }
    value
        .parse()
        .map(Rate::Fixed)
        .map_err(|_| format!("{value:?} is not a rate: max, records/s, or a percentage (50%)"))
}

fn parse_fsync(value: &str) -> Result<Fsync, String> {
    match value {
        "never" => Ok(Fsync::Never),
        "always" => Ok(Fsync::Always),
        other => other
            .strip_prefix("interval:")
            .and_then(|ms| ms.parse().ok())
            .map(Fsync::IntervalMs)
            .ok_or_else(|| format!("{other:?} is not an fsync policy: never, always, interval:MS")),
    }
}

impl BenchArgs {
    /// The preset's workload with this command line's overrides.
    fn workload(&self, preset: &str) -> Result<Workload> {
        let mut w = Preset::named(preset)?;
        if let Some(seconds) = self.duration {
            w.stop = Stop::Seconds(seconds);
        }
        if let Some(records) = self.records {
            w.stop = Stop::Records(records);
        }
        let set = |field: &mut u32, value: Option<u32>| {
            if let Some(value) = value {
                *field = value;
            }
        };
        set(&mut w.producers, self.producers);
        set(&mut w.consumers, self.consumers);
        set(&mut w.consumer_groups, self.groups);
        set(&mut w.topics, self.topics);
        set(&mut w.partitions, self.partitions);
        set(&mut w.record_bytes, self.record_size);
        set(&mut w.batch_records, self.batch);
        set(&mut w.linger_ms, self.linger_ms);
        set(&mut w.in_flight, self.in_flight);
        if let Some(warmup) = self.warmup {
            w.warmup_seconds = warmup;
        }
        if let Some(mode) = self.mode {
            w.mode = mode;
            // A preset without consumers run in a consuming mode gets one.
            if mode != Mode::Produce && w.consumers == 0 && self.consumers.is_none() {
                w.consumers = 1;
            }
        }
        if let Some(keys) = self.keys {
            w.key_cardinality = (keys > 0).then_some(keys);
        }
        if let Some(rate) = self.rate {
            w.rate = rate;
        }
        if let Some(fsync) = self.fsync {
            w.fsync = fsync;
        }
        w.sessions |= self.sessions;
        w.validate()?;
        Ok(w)
    }
}

/// Runs `braid bench`. `json` is the global `--json`: `Some(None)` prints the report as
/// JSON instead of tables, `Some(Some(file))` also writes it there.
pub(crate) fn bench(
    addrs: &[String],
    connect: braid_client::ConnectOptions,
    json: Option<Option<PathBuf>>,
    args: BenchArgs,
) -> Result<()> {
    if args.list {
        let rows = PRESETS
            .iter()
            .map(|p| vec![p.name.to_owned(), p.about.to_owned()])
            .collect();
        table::print(&["PRESET", "WORKLOAD"], rows);
        return Ok(());
    }
    let preset = args.preset.clone().unwrap_or_default();
    if preset == "retirement" {
        return retirement(addrs, connect, json, &args);
    }
    let workload = args.workload(&preset)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let embedded = if args.embedded {
        if args.members > 1 {
            eprintln!("starting an embedded cluster of {} members", args.members);
        }
        Some(EmbeddedNode::start(args.data_dir.as_deref(), args.members)?)
    } else {
        None
    };
    let scratch = match (&embedded, &args.data_dir) {
        (Some(node), _) => node.data_dir().to_path_buf(),
        (None, Some(dir)) => dir.clone(),
        (None, None) => std::env::temp_dir(),
    };
    let targets: Vec<SocketAddr> = match &embedded {
        Some(nodes) => nodes.client_addrs(),
        None => addrs
            .iter()
            .map(|addr| {
                addr.parse().with_context(|| {
                    format!("--addr {addr:?} is not HOST:PORT with a numeric host")
                })
            })
            .collect::<Result<_>>()?,
    };
    let target = braid_bench::Target::cluster(targets, connect);
    // References first, so their dirty pages are gone before the run starts.
    let references = if args.reference {
        eprintln!("measuring references ({} MiB each)", args.reference_mib);
        Some(
            reference::measure(&scratch, args.reference_mib << 20)
                .context("measuring references")?,
        )
    } else {
        None
    };
    let counters = Arc::new(Counters::default());
    let progress = Progress::start(&workload, Arc::clone(&counters));
    let options = RunOptions { keep: args.keep };
    let result = runtime.block_on(async {
        let ticker = tokio::spawn(progress.clone().tick());
        let result = braid_bench::run(&target, &workload, &options, Arc::clone(&counters)).await;
        ticker.abort();
        result
    });
    progress.finish();
    if let Some(node) = embedded {
        node.stop();
    }
    let mut report = result?;
    report.references = references;
    report.target = match args.members {
        _ if !args.embedded => addrs.join(","),
        1 => "embedded node".to_owned(),
        n => format!("embedded cluster of {n} members"),
    };
    let as_json = json.is_some();
    if let Some(Some(path)) = &json {
        std::fs::write(path, report.to_json()?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if as_json && !matches!(json, Some(Some(_))) {
        println!("{}", report.to_json()?);
    } else {
        print_report(&preset, &report);
    }
    if let Some(path) = &args.chart {
        chart::draw(&report, path)?;
        eprintln!("chart written to {}", path.display());
    }
    if report.errors > 0 {
        bail!("{} errors during the run", report.errors);
    }
    Ok(())
}

/// The live progress bar on standard error; drawn only on a terminal.
#[derive(Clone)]
struct Progress {
    bar: ProgressBar,
    counters: Arc<Counters>,
    record_bytes: u64,
    /// The bar counts records (a run by count) rather than seconds.
    by_records: bool,
}

impl Progress {
    fn start(workload: &Workload, counters: Arc<Counters>) -> Self {
        let bar = match workload.stop {
            Stop::Seconds(s) => ProgressBar::new(s + workload.warmup_seconds),
            Stop::Records(n) => ProgressBar::new(n),
        };
        if std::io::stderr().is_terminal() {
            bar.set_draw_target(ProgressDrawTarget::stderr());
        } else {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
        let template = "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}";
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style);
        }
        Self {
            bar,
            counters,
            record_bytes: u64::from(workload.record_bytes),
            by_records: matches!(workload.stop, Stop::Records(_)),
        }
    }

    /// Updates the bar four times a second: phase, rates now and on average, errors.
    async fn tick(self) {
        let period = Duration::from_millis(250);
        let started = std::time::Instant::now();
        let mut running_since = None;
        let mut last = (0u64, 0u64);
        let mut interval = tokio::time::interval(period);
        loop {
            interval.tick().await;
            let produced = self
                .counters
                .produced
                .load(std::sync::atomic::Ordering::Relaxed);
            let consumed = self
                .counters
                .consumed
                .load(std::sync::atomic::Ordering::Relaxed);
            let errors = self
                .counters
                .errors
                .load(std::sync::atomic::Ordering::Relaxed);
            let phase = self.counters.phase();
            let secs = started.elapsed().as_secs_f64().max(1e-3);
            let per_period = |now: u64, before: u64| (now - before) as f64 / period.as_secs_f64();
            let rate = |records: f64| {
                format!(
                    "{:.0} rec/s {:.0} MB/s",
                    records,
                    records * self.record_bytes as f64 / 1e6
                )
            };
            let mut message = format!(
                "{} | produce {} (avg {})",
                phase.name(),
                rate(per_period(produced, last.0)),
                rate(produced as f64 / secs)
            );
            if consumed > 0 {
                message.push_str(&format!(
                    " | consume {}",
                    rate(per_period(consumed, last.1))
                ));
            }
            message.push_str(&format!(" | errors {errors}"));
            self.bar.set_message(message);
            if matches!(phase, Phase::Preload | Phase::Warmup | Phase::Measure) {
                let since = *running_since.get_or_insert_with(std::time::Instant::now);
                self.bar.set_position(if self.by_records {
                    produced
                } else {
                    since.elapsed().as_secs()
                });
            }
            last = (produced, consumed);
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

fn workload_line(preset: &str, w: &Workload) -> String {
    let mode = match w.mode {
        Mode::Produce => "produce",
        Mode::Consume => "consume (catch-up)",
        Mode::ProduceConsume => "produce and consume",
    };
    let rate = match w.rate {
        Rate::Max => "max".to_owned(),
        Rate::Fixed(r) => format!("{r} records/s"),
        Rate::PercentOfMax(p) => format!("{p}% of max"),
    };
    let stop = match w.stop {
        Stop::Seconds(s) => format!("{s} s after {} s warm-up", w.warmup_seconds),
        Stop::Records(n) => format!("{n} records"),
    };
    let fsync = match w.fsync {
        Fsync::Never => "never".to_owned(),
        Fsync::Always => "always".to_owned(),
        Fsync::IntervalMs(ms) => format!("every {ms} ms"),
    };
    let keys = w
        .key_cardinality
        .map_or("keyless".to_owned(), |k| format!("{k} keys"));
    format!(
        "{preset}: {mode}; {} producers, {} consumers in {} groups; {} topics x {} partitions; {} B records, batches of {}, {keys}; rate {rate}; fsync {fsync}; {stop}",
        w.producers, w.consumers, w.consumer_groups, w.topics, w.partitions, w.record_bytes, w.batch_records
    )
}

fn print_report(preset: &str, report: &Report) {
    println!("{}", workload_line(preset, &report.workload));
    if !report.target.is_empty() {
        println!("against {}", report.target);
    }
    println!();
    let loopback = report.references.map(|r| r.loopback_tcp_mb_per_sec);
    let file = report.references.map(|r| r.file_write_mb_per_sec);
    let ratio = |t: &Throughput, of: Option<f64>| {
        of.filter(|r| *r > 0.0)
            .map_or("-".to_owned(), |r| format!("{:.2}", t.mb_per_sec / r))
    };
    let produce_label = if report.workload.mode == Mode::Consume {
        "produce (preload)"
    } else {
        "produce"
    };
    let rows = [(produce_label, report.produce), ("consume", report.consume)]
        .into_iter()
        .filter_map(|(label, t)| {
            let t = t?;
            Some(vec![
                label.to_owned(),
                format!("{:.0}", t.records_per_sec),
                format!("{:.1}", t.mb_per_sec),
                t.records.to_string(),
                format!("{:.1}", t.seconds),
                ratio(&t, loopback),
                ratio(&t, file),
            ])
        })
        .collect();
    table::print(
        &[
            "THROUGHPUT",
            "RECORDS/S",
            "MB/S",
            "RECORDS",
            "SECONDS",
            "OF LOOPBACK",
            "OF FILE WRITE",
        ],
        rows,
    );
    println!();
    let ms = |us: u64| format!("{:.3}", us as f64 / 1e3);
    let rows = [
        ("produce ack", report.ack_latency),
        ("end to end", report.end_to_end_latency),
    ]
    .into_iter()
    .filter_map(|(label, l): (&str, Option<LatencySummary>)| {
        let l = l?;
        Some(vec![
            label.to_owned(),
            ms(l.p50_us),
            ms(l.p90_us),
            ms(l.p99_us),
            ms(l.p999_us),
            ms(l.max_us),
            l.count.to_string(),
        ])
    })
    .collect();
    table::print(
        &[
            "LATENCY (MS)",
            "P50",
            "P90",
            "P99",
            "P99.9",
            "MAX",
            "RECORDS",
        ],
        rows,
    );
    println!();
    if let Some(rate) = report.target_rate {
        match report.probed_max_rate {
            Some(max) => println!("paced at {rate} records/s (the probe measured {max} unpaced)"),
            None => println!("paced at {rate} records/s"),
        }
    }
    if let Some(r) = report.references {
        println!(
            "references: file write {:.1} MB/s, loopback TCP {:.1} MB/s",
            r.file_write_mb_per_sec, r.loopback_tcp_mb_per_sec
        );
    }
    println!("errors: {}", report.errors);
}

/// `braid bench retirement (--embedded --members 3 | --addr A,B,C --http-addrs H,I,J)
/// [--partitions N] [--retire-sessions S]`: seed 001's experiment
/// (`braid_bench::retire`), on an embedded cluster or a running one (its figures come
/// from the members' `/metrics`). A cluster of separate processes (`braid cluster
/// local 3`) gives each member its own limit of open files.
fn retirement(
    addrs: &[String],
    connect: braid_client::ConnectOptions,
    json: Option<Option<PathBuf>>,
    args: &BenchArgs,
) -> Result<()> {
    let parse = |flag: &str, addr: &String| -> Result<SocketAddr> {
        addr.parse()
            .with_context(|| format!("{flag} {addr:?} is not HOST:PORT with a numeric host"))
    };
    if !args.embedded && args.http_addrs.len() != addrs.len() {
        bail!(
            "the retirement experiment reads every member's /metrics: give --embedded, or \
             --http-addrs with one HTTP address per --addr"
        );
    }
    let run = braid_bench::retire::RetireRun {
        partitions: args.partitions.unwrap_or(30_000),
        sessions: args.retire_sessions,
        fsync: args.fsync.unwrap_or(braid_bench::Fsync::Always),
    };
    let nodes = if args.embedded {
        eprintln!("starting {} member(s)", args.members);
        Some(EmbeddedNode::start(args.data_dir.as_deref(), args.members)?)
    } else {
        None
    };
    eprintln!(
        "{} partitions (fsync {:?}), {} sessions per pass",
        run.partitions, run.fsync, run.sessions
    );
    let (targets, https) = match &nodes {
        Some(nodes) => (nodes.client_addrs(), nodes.http_addrs()),
        None => (
            addrs
                .iter()
                .map(|a| parse("--addr", a))
                .collect::<Result<Vec<_>>>()?,
            args.http_addrs
                .iter()
                .map(|a| parse("--http-addrs", a))
                .collect::<Result<Vec<_>>>()?,
        ),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let target = braid_bench::Target::cluster(targets, connect);
    let passes = runtime.block_on(braid_bench::retire::run_retirement(&target, &https, run));
    if let Some(nodes) = nodes {
        nodes.stop();
    }
    let passes = passes?;
    let rows = passes
        .iter()
        .map(|p| {
            vec![
                p.pass.to_owned(),
                format!("{:.1}", p.produce_secs),
                format!("{:.2}", p.finalize_secs),
                p.finalize_ops.to_string(),
                format!("{:?}", p.peak_unproven),
                p.debt_copies.to_string(),
                p.barriers.to_string(),
                p.heartbeats_unanswered.to_string(),
            ]
        })
        .collect();
    table::print(
        &[
            "PASS",
            "WRITE S",
            "TO FINALIZE S",
            "FINALIZE OPS",
            "PEAK UNPROVEN PER MEMBER",
            "DEBT",
            "BARRIERS",
            "UNANSWERED",
        ],
        rows,
    );
    let text = serde_json::to_string_pretty(&passes)?;
    match json {
        Some(Some(path)) => {
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?
        }
        Some(None) => println!("{text}"),
        None => {}
    }
    Ok(())
}
