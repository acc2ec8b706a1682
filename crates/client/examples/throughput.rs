//! Single-node throughput against raw loopback TCP, measured in one run: one producer
//! sends 1 KiB records in batches of 1,000 to one partition (`fsync = never`), then one
//! consumer reads them back. The reference is a plain TCP transfer of the same bytes
//! over loopback. Figures are medians of `--runs`.
//!
//! ```sh
//! cargo run --release -p braid-client --example throughput -- --records 1000000 --runs 3
//! ```

use std::time::{Duration, Instant};

use braid_client::{Client, Consumer, ConsumerConfig, Producer, ProducerConfig};
use braid_node::{FsyncSetting, Node, NodeConfig};
use braid_proto::client::TopicSettings;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const RECORD_BYTES: usize = 1024;
const BATCH_RECORDS: usize = 1000;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Bytes per second of a plain loopback TCP transfer of `total` bytes in `chunk`s.
async fn loopback_reference(total: u64, chunk: usize) -> Res<f64> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let receiver = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await?;
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        while got < total {
            let n = socket.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            got += n as u64;
        }
        Ok::<u64, std::io::Error>(got)
    });
    let data = vec![7u8; chunk];
    let start = Instant::now();
    let mut socket = tokio::net::TcpStream::connect(addr).await?;
    let mut sent = 0u64;
    while sent < total {
        socket.write_all(&data).await?;
        sent += chunk as u64;
    }
    let got = receiver.await??;
    Ok(got as f64 / start.elapsed().as_secs_f64())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let records = arg("--records", 1_000_000);
    let runs = arg("--runs", 3) as usize;
    let value = vec![0x5au8; RECORD_BYTES];
    // The producer closes a batch once it reaches 1,000 records' worth of bytes.
    let mut probe = braid_proto::BatchBuilder::new(0);
    for i in 0..BATCH_RECORDS as u64 {
        probe.push(Some(&i.to_be_bytes()), Some(&value), &[], 0);
    }
    let batch_bytes = probe.len_bytes();
    let total_bytes = batch_bytes as u64 * records / BATCH_RECORDS as u64;
    let (mut reference, mut produce, mut consume) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        let dir = tempfile::tempdir_in(std::env::current_dir()?)?;
        let mut config = NodeConfig {
            data_dir: dir.path().to_path_buf(),
            client_addr: "127.0.0.1:0".parse()?,
            http_addr: "127.0.0.1:0".parse()?,
            ..NodeConfig::default()
        };
        config.topic_defaults.fsync = FsyncSetting::Never;
        config.topic_defaults.max_batch_bytes = 2 << 20;
        let node = Node::start(config)?;
        let client = Client::connect(node.client_addr()).await?;
        client.create_stream("bench").await?;
        client
            .create_topic(
                "bench",
                "t",
                TopicSettings {
                    partitions: 1,
                    ..TopicSettings::default()
                },
            )
            .await?;
        let producer_config = ProducerConfig {
            batch_bytes,
            linger: Duration::from_millis(20),
            max_in_flight: 8,
        };
        let producer = Producer::new(&client, "bench", "t", producer_config).await?;
        let start = Instant::now();
        let mut pending = Vec::with_capacity(BATCH_RECORDS * 16);
        for i in 0..records {
            pending.push(producer.send(Some(&i.to_be_bytes()), &value));
            if pending.len() == BATCH_RECORDS * 16 {
                for send in pending.drain(..) {
                    send.await?;
                }
            }
        }
        producer.flush();
        for send in pending {
            send.await?;
        }
        let produce_s = start.elapsed().as_secs_f64();

        let config = ConsumerConfig {
            fetch_bytes_max: 4 << 20,
            ..ConsumerConfig::default()
        };
        let mut consumer = Consumer::assigned(&client, "bench", "t", &[0], config).await?;
        let start = Instant::now();
        let mut read = 0u64;
        while read < records {
            read += consumer.poll(Duration::from_millis(100)).await?.len() as u64;
        }
        let consume_s = start.elapsed().as_secs_f64();
        drop(consumer);
        drop(producer);
        node.shutdown();
        let reference_bps = loopback_reference(total_bytes, batch_bytes).await?;
        eprintln!(
            "run {}: produce {:.0} MB/s, consume {:.0} MB/s, loopback {:.0} MB/s",
            run + 1,
            total_bytes as f64 / produce_s / 1e6,
            total_bytes as f64 / consume_s / 1e6,
            reference_bps / 1e6
        );
        reference.push(reference_bps);
        produce.push(produce_s);
        consume.push(consume_s);
    }
    let mut produce_ratio: Vec<f64> = produce
        .iter()
        .zip(&reference)
        .map(|(s, r)| total_bytes as f64 / s / r)
        .collect();
    let mut consume_ratio: Vec<f64> = consume
        .iter()
        .zip(&reference)
        .map(|(s, r)| total_bytes as f64 / s / r)
        .collect();
    let mut produce_rps: Vec<f64> = produce.iter().map(|s| records as f64 / s).collect();
    let mut consume_rps: Vec<f64> = consume.iter().map(|s| records as f64 / s).collect();
    let mut reference_mbs: Vec<f64> = reference.iter().map(|r| r / 1e6).collect();
    println!("{records} records of {RECORD_BYTES} bytes, batches of {BATCH_RECORDS}, 1 partition, fsync never, median of {runs} runs");
    println!(
        "loopback TCP reference: {:.0} MB/s",
        median(&mut reference_mbs)
    );
    let produce_rps = median(&mut produce_rps);
    println!(
        "produce: {:.0} records/s, {:.0} MB/s, {:.2} of loopback",
        produce_rps,
        produce_rps * batch_bytes as f64 / BATCH_RECORDS as f64 / 1e6,
        median(&mut produce_ratio)
    );
    let consume_rps = median(&mut consume_rps);
    println!(
        "consume: {:.0} records/s, {:.0} MB/s, {:.2} of loopback",
        consume_rps,
        consume_rps * batch_bytes as f64 / BATCH_RECORDS as f64 / 1e6,
        median(&mut consume_ratio)
    );
    Ok(())
}
