//! What refusing keyed records outside their partition's range costs a produce: the
//! validation every produce pays (CRC-32C and a record walk) with and without the
//! key-range check folded into its walk (a Murmur3 hash per keyed record), on the same
//! batches in the same run.
//!
//! ```sh
//! cargo bench -p braid-proto --bench key_range -- [--records 1000] [--value-bytes 1024] [--runs 7]
//! ```
//!
//! Prints the median time of each per batch and their ratio.

use std::time::Instant;

use braid_proto::{BatchBuilder, ValidatedBatch};
use bytes::BytesMut;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn main() -> Result<(), braid_proto::BatchError> {
    let records = arg("--records", 1000);
    let value_bytes = arg("--value-bytes", 1024);
    let runs = arg("--runs", 7);
    let value = vec![7u8; value_bytes];
    let mut builder = BatchBuilder::new(1_000);
    for i in 0..records {
        let key = format!("customer-{i:07}");
        builder.push(Some(key.as_bytes()), Some(&value), &[], 1_000);
    }
    let bytes = builder.finish();
    // A range holding every key, so the walk goes to the end, as for an honest producer.
    let (start, end) = (0u16, u16::MAX - 1);
    let iterations = 200;
    let (mut validate, mut checked) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let copies: Vec<BytesMut> = (0..iterations)
            .map(|_| BytesMut::from(&bytes[..]))
            .collect();
        let started = Instant::now();
        for copy in copies {
            std::hint::black_box(ValidatedBatch::from_bytes_mut(copy)?);
        }
        validate.push(started.elapsed().as_secs_f64() / iterations as f64);
        let copies: Vec<BytesMut> = (0..iterations)
            .map(|_| BytesMut::from(&bytes[..]))
            .collect();
        let started = Instant::now();
        for copy in copies {
            std::hint::black_box(ValidatedBatch::for_key_range(copy, start, end)?);
        }
        checked.push(started.elapsed().as_secs_f64() / iterations as f64);
    }
    let (validate, checked) = (median(&mut validate), median(&mut checked));
    println!(
        "{records} records of {value_bytes} bytes with 15-byte keys ({} bytes a batch), median of {runs}:",
        bytes.len()
    );
    println!(
        "  validation                  {:>9.1} µs a batch",
        validate * 1e6
    );
    println!(
        "  validation + key-range check {:>8.1} µs a batch",
        checked * 1e6
    );
    println!("  ratio: {:.2}", checked / validate);
    Ok(())
}
