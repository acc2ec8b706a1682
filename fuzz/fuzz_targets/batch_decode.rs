//! Arbitrary bytes into the batch decoder: it must return an error or a batch whose
//! records and headers all iterate, never panic.
#![no_main]

use braid_proto::batch::{parse_record, BatchHeader, RecordBatch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = BatchHeader::decode(data);
    let _ = parse_record(data);
    let _ = RecordBatch::check_frame(data);
    if let Ok((batch, used)) = RecordBatch::validate(data) {
        assert!(used <= data.len());
        assert_eq!(used, batch.header().total_bytes());
        let mut count = 0i32;
        for record in batch.records() {
            let record = record.expect("a validated batch iterates");
            for header in record.headers.iter() {
                header.expect("a validated record's headers iterate");
            }
            count += 1;
        }
        assert_eq!(count, batch.header().record_count);
    }
    // Many batches back to back, as a log segment holds them.
    let mut rest = data;
    while let Ok((_, used)) = RecordBatch::check_frame(rest) {
        rest = &rest[used..];
    }
});
