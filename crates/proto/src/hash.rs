//! Where a key lands on the 16-bit hash ring.
//!
//! A key's place is the high 16 bits of the Murmur3 x86_32 hash (seed 0) of its bytes,
//! the rule Pulsar's scalable topics use, so both place a key alike. A partition covers
//! an inclusive range of the ring; a topic created with N partitions starts with N
//! equal ranges.

/// The ring position of a key.
pub fn key_hash(key: &[u8]) -> u16 {
    (murmur3_x86_32(key, 0) >> 16) as u16
}

/// Murmur3 x86_32 of `data` (from the `murmur3` crate).
pub fn murmur3_x86_32(data: &[u8], seed: u32) -> u32 {
    // Reading from a slice cannot fail; 0 is never reached.
    murmur3::murmur3_32(&mut std::io::Cursor::new(data), seed).unwrap_or(0)
}

/// The inclusive ranges of `count` equal partitions of the ring, in order. The last
/// range takes the remainder.
///
/// # Panics
/// If `count` is 0 or above 65,536: callers validate partition counts first.
pub fn equal_ranges(count: u32) -> Vec<(u16, u16)> {
    assert!((1..=65_536).contains(&count), "partition count {count}");
    let width = 65_536 / count;
    (0..count)
        .map(|i| {
            let start = i * width;
            let end = if i + 1 == count {
                65_535
            } else {
                start + width - 1
            };
            (start as u16, end as u16)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur3_matches_reference_vectors() {
        // Vectors of the reference implementation (SMHasher).
        assert_eq!(murmur3_x86_32(b"", 0), 0);
        assert_eq!(murmur3_x86_32(b"", 1), 0x514E_28B7);
        assert_eq!(murmur3_x86_32(b"", 0xffff_ffff), 0x81F1_6F39);
        assert_eq!(murmur3_x86_32(&[0xff, 0xff, 0xff, 0xff], 0), 0x7629_3B50);
        assert_eq!(murmur3_x86_32(&[0x21, 0x43, 0x65, 0x87], 0), 0xF55B_516B);
        assert_eq!(murmur3_x86_32(&[0x21, 0x43, 0x65], 0), 0x7E4A_8634);
        assert_eq!(murmur3_x86_32(&[0x21, 0x43], 0), 0xA0F7_B07A);
        assert_eq!(murmur3_x86_32(&[0x21], 0), 0x7266_1CF4);
        assert_eq!(murmur3_x86_32(b"Hello, world!", 1234), 0xFAF6_CDB3);
        assert_eq!(
            murmur3_x86_32(b"The quick brown fox jumps over the lazy dog", 0),
            0x2E4F_F723
        );
    }

    #[test]
    fn ranges_tile_the_ring() {
        for count in [1, 2, 3, 7, 8, 1000, 65_536] {
            let ranges = equal_ranges(count);
            assert_eq!(ranges.len(), count as usize);
            assert_eq!(ranges[0].0, 0);
            assert_eq!(ranges.last().unwrap().1, 65_535);
            for pair in ranges.windows(2) {
                assert_eq!(u32::from(pair[0].1) + 1, u32::from(pair[1].0));
            }
        }
        assert_eq!(
            key_hash(b"user-1"),
            (murmur3_x86_32(b"user-1", 0) >> 16) as u16
        );
    }
}
