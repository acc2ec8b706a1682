use super::*;
use proptest::prelude::*;

fn sample() -> Vec<u8> {
    let mut builder = BatchBuilder::new(1_000);
    builder.push(Some(b"k0"), Some(b"v0"), &[], 1_000);
    builder.push(None, None, &[(b"h", Some(b"x")), (b"n", None)], 1_007);
    builder.push(Some(b""), Some(b"value two"), &[], 995);
    builder.finish()
}

#[test]
fn built_batch_validates_and_iterates() {
    let bytes = sample();
    let (batch, used) = RecordBatch::validate(&bytes).unwrap();
    assert_eq!(used, bytes.len());
    let header = batch.header();
    assert_eq!(header.magic, 2);
    assert_eq!(header.record_count, 3);
    assert_eq!(header.last_offset_delta, 2);
    assert_eq!(header.base_timestamp, 1_000);
    assert_eq!(header.max_timestamp, 1_007);
    assert_eq!(header.total_bytes(), bytes.len());
    let records: Vec<_> = batch.records().map(Result::unwrap).collect();
    assert_eq!(records.len(), 3);
    assert_eq!(records[0].key, Some(&b"k0"[..]));
    assert_eq!(records[1].key, None);
    assert_eq!(records[1].value, None);
    assert_eq!(records[1].timestamp_delta, 7);
    let headers: Vec<_> = records[1].headers.iter().map(Result::unwrap).collect();
    assert_eq!(
        headers,
        [
            Header {
                key: b"h",
                value: Some(b"x")
            },
            Header {
                key: b"n",
                value: None
            }
        ]
    );
    assert_eq!(records[2].key, Some(&b""[..]));
    assert_eq!(records[2].timestamp_delta, -5);
    assert_eq!(records[2].offset_delta, 2);
}

#[test]
fn base_offset_and_epoch_are_outside_the_crc() {
    let mut batch = ValidatedBatch::new(sample()).unwrap();
    batch.set_base_offset(1 << 40);
    batch.set_partition_leader_epoch(9);
    let (again, _) = RecordBatch::validate(batch.as_bytes()).unwrap();
    assert_eq!(again.header().base_offset, 1 << 40);
    assert_eq!(again.header().last_offset(), (1 << 40) + 2);
    assert_eq!(again.header().partition_leader_epoch, 9);
}

#[test]
fn every_flipped_byte_is_caught() {
    let bytes = sample();
    for at in field::MAGIC..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x40;
        assert!(
            RecordBatch::validate(&damaged).is_err(),
            "flip at byte {at} went unnoticed"
        );
    }
}

/// A stored batch (its partition's tag in the leader epoch, its base offset checked by
/// its place) has no byte a flip goes unnoticed in, from the leader epoch on, and
/// another partition's copy of it is not taken for it.
#[test]
fn every_flipped_byte_of_a_stored_batch_is_caught() {
    const TAG: i32 = 0x0007_0003;
    let mut stored = ValidatedBatch::new(sample()).unwrap();
    stored.set_partition_leader_epoch(TAG);
    let bytes = stored.as_bytes().to_vec();
    assert!(RecordBatch::check_stored(&bytes, TAG).is_ok());
    assert_eq!(
        RecordBatch::check_stored(&bytes, TAG + 1).map(|_| ()),
        Err(BatchError::StoredEpoch {
            found: TAG,
            expected: TAG + 1
        })
    );
    for at in field::PARTITION_LEADER_EPOCH..bytes.len() {
        for bit in 0..8 {
            let mut damaged = bytes.clone();
            damaged[at] ^= 1 << bit;
            assert!(
                RecordBatch::check_stored(&damaged, TAG).is_err(),
                "flip of bit {bit} at byte {at} went unnoticed"
            );
        }
    }
    stored.set_partition_leader_epoch(-1);
    assert_eq!(
        RecordBatch::check_stored(stored.as_bytes(), TAG).map(|_| ()),
        Err(BatchError::StoredEpoch {
            found: -1,
            expected: TAG
        })
    );
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample();
    for len in 0..bytes.len() {
        let err = RecordBatch::validate(&bytes[..len]).unwrap_err();
        assert!(matches!(err, BatchError::Truncated { .. }), "{len}: {err}");
    }
}

fn with_attributes(attributes: u16) -> Vec<u8> {
    let mut bytes = sample();
    bytes[field::ATTRIBUTES..][..2].copy_from_slice(&attributes.to_be_bytes());
    let crc = crc32c::crc32c(&bytes[field::ATTRIBUTES..]);
    bytes[field::CRC..][..4].copy_from_slice(&crc.to_be_bytes());
    bytes
}

#[test]
fn compressed_batch_is_refused_not_misread() {
    for (code, codec) in [
        (1, Compression::Gzip),
        (2, Compression::Snappy),
        (3, Compression::Lz4),
        (4, Compression::Zstd),
        (6, Compression::Unknown(6)),
    ] {
        let err = RecordBatch::validate(&with_attributes(code)).unwrap_err();
        assert_eq!(err, BatchError::Compressed { codec });
        assert!(err.to_string().contains("compressed"), "{err}");
    }
}

#[test]
fn transactional_and_control_batches_are_refused() {
    for bits in [
        attribute::TRANSACTIONAL,
        attribute::CONTROL,
        attribute::LOG_APPEND_TIME,
    ] {
        let err = RecordBatch::validate(&with_attributes(bits)).unwrap_err();
        assert!(
            matches!(err, BatchError::UnsupportedAttributes { .. }),
            "{err}"
        );
    }
}

#[test]
fn empty_batch_is_refused() {
    let bytes = BatchBuilder::new(0).finish();
    let err = RecordBatch::validate(&bytes).unwrap_err();
    assert!(matches!(err, BatchError::BadRecordCount { .. }), "{err}");
}

#[test]
fn trailing_bytes_after_one_batch_are_refused_by_validated_batch() {
    let mut bytes = sample();
    bytes.push(0);
    assert_eq!(
        ValidatedBatch::new(bytes).unwrap_err(),
        BatchError::TrailingBytes { extra: 1 }
    );
}

#[test]
fn wrong_magic_and_short_length_are_refused() {
    let mut bytes = sample();
    bytes[field::MAGIC] = 1;
    assert_eq!(
        RecordBatch::validate(&bytes).unwrap_err(),
        BatchError::BadMagic { found: 1 }
    );
    let mut bytes = sample();
    bytes[field::BATCH_LENGTH..][..4].copy_from_slice(&10i32.to_be_bytes());
    assert!(matches!(
        RecordBatch::validate(&bytes).unwrap_err(),
        BatchError::BadLength { batch_length: 10 }
    ));
}

/// A batch written by hand from the format description, with its CRC32C computed by an
/// independent table implementation, so the builder, decoder and `crc32c` crate are all
/// checked against the spec rather than against each other.
#[test]
fn hand_encoded_batch_decodes() {
    let mut record = vec![
        0x00, // attributes
        0x00, // timestamp delta 0
        0x00, // offset delta 0
        0x02, b'k', // key length 1, "k"
        0x04, b'v', b'1', // value length 2, "v1"
        0x00, // no headers
    ];
    record.insert(0, (record.len() as u8) << 1); // length varint (zig-zag)
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&7i64.to_be_bytes()); // base offset
    bytes.extend_from_slice(&((49 + record.len()) as i32).to_be_bytes());
    bytes.extend_from_slice(&0i32.to_be_bytes()); // leader epoch
    bytes.push(2); // magic
    bytes.extend_from_slice(&[0; 4]); // crc, below
    bytes.extend_from_slice(&0i16.to_be_bytes()); // attributes
    bytes.extend_from_slice(&0i32.to_be_bytes()); // last offset delta
    bytes.extend_from_slice(&42i64.to_be_bytes()); // base timestamp
    bytes.extend_from_slice(&42i64.to_be_bytes()); // max timestamp
    bytes.extend_from_slice(&(-1i64).to_be_bytes()); // producer id
    bytes.extend_from_slice(&(-1i16).to_be_bytes()); // producer epoch
    bytes.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
    bytes.extend_from_slice(&1i32.to_be_bytes()); // record count
    bytes.extend_from_slice(&record);
    let crc = crc32c_bitwise(&bytes[21..]);
    bytes[17..21].copy_from_slice(&crc.to_be_bytes());

    let (batch, used) = RecordBatch::validate(&bytes).unwrap();
    assert_eq!(used, bytes.len());
    assert_eq!(batch.header().base_offset, 7);
    let record = batch.records().next().unwrap().unwrap();
    assert_eq!(
        (record.key, record.value),
        (Some(&b"k"[..]), Some(&b"v1"[..]))
    );

    let mut builder = BatchBuilder::new(42);
    builder.push(Some(b"k"), Some(b"v1"), &[], 42);
    let mut built = builder.finish();
    set_base_offset(&mut built, 7);
    set_partition_leader_epoch(&mut built, 0);
    assert_eq!(
        built, bytes,
        "the builder writes the same bytes as the spec"
    );
}

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), one bit at a time.
fn crc32c_bitwise(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn crc32c_check_value() {
    // The standard check value of CRC-32C over "123456789".
    assert_eq!(crc32c_bitwise(b"123456789"), 0xE306_9283);
    assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
}

type RecordSpec = (
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Vec<(Vec<u8>, Option<Vec<u8>>)>,
    i64,
);

fn record_spec() -> impl Strategy<Value = RecordSpec> {
    let bytes = || proptest::collection::vec(any::<u8>(), 0..40);
    (
        proptest::option::of(bytes()),
        proptest::option::of(bytes()),
        proptest::collection::vec((bytes(), proptest::option::of(bytes())), 0..3),
        -1_000_000i64..1_000_000,
    )
}

proptest! {
    #[test]
    fn round_trip(records in proptest::collection::vec(record_spec(), 1..20), base in any::<i32>()) {
        let base = i64::from(base);
        let mut builder = BatchBuilder::new(base);
        for (key, value, headers, delta) in &records {
            let headers: Vec<(&[u8], Option<&[u8]>)> =
                headers.iter().map(|(k, v)| (k.as_slice(), v.as_deref())).collect();
            builder.push(key.as_deref(), value.as_deref(), &headers, base + delta);
        }
        let bytes = builder.finish();
        let (batch, used) = RecordBatch::validate(&bytes).unwrap();
        prop_assert_eq!(used, bytes.len());
        for (record, (key, value, headers, delta)) in batch.records().zip(&records) {
            let record = record.unwrap();
            prop_assert_eq!(record.key, key.as_deref());
            prop_assert_eq!(record.value, value.as_deref());
            prop_assert_eq!(record.timestamp_delta, *delta);
            let got: Vec<_> = record.headers.iter().map(Result::unwrap).collect();
            prop_assert_eq!(got.len(), headers.len());
            for (got, (k, v)) in got.iter().zip(headers) {
                prop_assert_eq!(got.key, k.as_slice());
                prop_assert_eq!(got.value, v.as_deref());
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = RecordBatch::validate(&bytes);
        let _ = BatchHeader::decode(&bytes);
        let _ = parse_record(&bytes);
    }

    #[test]
    fn damaged_batches_never_panic(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let mut bytes = sample();
        for (at, byte) in flips {
            let at = at % bytes.len();
            bytes[at] = byte;
        }
        // Re-seal the CRC so the record parser itself sees the damage.
        let crc = crc32c::crc32c(&bytes[field::ATTRIBUTES..]);
        bytes[field::CRC..][..4].copy_from_slice(&crc.to_be_bytes());
        if let Ok((batch, _)) = RecordBatch::validate(&bytes) {
            for record in batch.records() {
                let record = record.unwrap();
                for header in record.headers.iter() {
                    header.unwrap();
                }
            }
        }
    }
}

#[test]
fn the_key_range_check_refuses_a_key_outside_and_lets_keyless_records_pass() {
    let key = b"a key";
    let hash = crate::hash::key_hash(key);
    let batch = |keyed: bool| {
        let mut builder = BatchBuilder::new(1_000);
        builder.push(None, Some(b"keyless"), &[], 1_000);
        if keyed {
            builder.push(Some(key), Some(b"keyed"), &[], 1_000);
        }
        BytesMut::from(&builder.finish()[..])
    };
    assert!(ValidatedBatch::for_key_range(batch(true), hash, hash).is_ok());
    assert!(ValidatedBatch::for_key_range(batch(true), 0, u16::MAX).is_ok());
    assert_eq!(
        ValidatedBatch::for_key_range(batch(true), hash.wrapping_add(1), hash.wrapping_add(1))
            .err(),
        Some(BatchError::KeyOutOfRange { index: 1, hash })
    );
    assert!(
        ValidatedBatch::for_key_range(batch(false), 7, 7).is_ok(),
        "keyless anywhere"
    );
}

proptest! {
    /// Two partitions of topics below 65,536 with fewer than 65,536 partitions never
    /// share a tag, so neither takes the other's batches for its own.
    #[test]
    fn partition_tags_differ_in_the_documented_range(
        a in (0u32..65_536, 0u32..65_536),
        b in (0u32..65_536, 0u32..65_536),
    ) {
        prop_assume!(a != b);
        prop_assert_ne!(partition_tag(a.0, a.1), partition_tag(b.0, b.1));
    }
}

#[test]
fn a_partition_tag_is_the_topic_high_and_the_partition_low() {
    assert_eq!(partition_tag(3, 1), 0x0003_0001);
    assert_eq!(partition_tag(0, 0), 0);
    assert_eq!(partition_tag(0xffff, 0xffff), -1);
}

/// Numbering a built batch as a session's request keeps it valid: the CRC is computed
/// again over the new fields.
#[test]
fn a_batch_numbered_after_it_was_built_still_validates() {
    let mut builder = BatchBuilder::new(5);
    builder.push(Some(b"k"), Some(b"v"), &[], 5);
    let mut bytes = builder.finish();
    set_producer(&mut bytes, 41, 7).unwrap();
    let (batch, _) = RecordBatch::validate(&bytes).unwrap();
    let header = batch.header();
    assert_eq!(
        (
            header.producer_id,
            header.producer_epoch,
            header.base_sequence
        ),
        (41, -1, 7)
    );
    assert!(set_producer(&mut bytes[..10], 1, 1).is_err());
}
