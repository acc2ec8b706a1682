//! What refusing keyed records outside their partition's range costs a produce: the
//! key-range check (a Murmur3 hash per keyed record) against the batch validation every
//! produce already pays (CRC-32C and a record walk), on the same batches in the same run.
//!
//! ```sh
//! cargo bench -p braid-proto --bench key_range -- [--records 1000] [--value-bytes 1024] [--runs 7]
//! ```
//!
//! Prints the median time of each per batch and their ratio.

use std::time::Instant;

use braid_proto::{BatchBuilder, ValidatedBatch};

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
    let (mut validate, mut check, mut walk) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let copies: Vec<Vec<u8>> = (0..iterations).map(|_| bytes.clone()).collect();
        let started = Instant::now();
        let batches = copies
            .into_iter()
            .map(ValidatedBatch::new)
            .collect::<Result<Vec<_>, _>>()?;
        validate.push(started.elapsed().as_secs_f64() / iterations as f64);
        let started = Instant::now();
        let mut outside = 0;
        for batch in &batches {
            outside += usize::from(batch.key_outside(start, end).is_some());
        }
        check.push(started.elapsed().as_secs_f64() / iterations as f64);
        std::hint::black_box(outside);
        // The record walk alone, to tell it from the hashing.
        let started = Instant::now();
        let mut key_bytes = 0usize;
        for batch in &batches {
            for record in batch.as_record_batch().records() {
                key_bytes += record.ok().and_then(|r| r.key).map_or(0, <[u8]>::len);
            }
        }
        walk.push(started.elapsed().as_secs_f64() / iterations as f64);
        std::hint::black_box(key_bytes);
    }
    let (validate, check, walk) = (median(&mut validate), median(&mut check), median(&mut walk));
    println!(
        "{records} records of {value_bytes} bytes with 15-byte keys ({} bytes a batch), median of {runs}:",
        bytes.len()
    );
    println!("  validation        {:>9.1} µs a batch", validate * 1e6);
    println!("  key-range check   {:>9.1} µs a batch", check * 1e6);
    println!("    of which the record walk {:>6.1} µs", walk * 1e6);
    println!("  check / validation: {:.2}", check / validate);
    Ok(())
}
