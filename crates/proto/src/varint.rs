//! Kafka's variable-length integers: zig-zag encoded, then base-128 little-endian
//! groups with a continuation bit (the protobuf `sint32`/`sint64` encoding).
//!
//! A `varint` holds an `i32` in at most 5 bytes, a `varlong` an `i64` in at most 10.

/// Why a varint could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VarintFault {
    /// The input ended inside the varint.
    Truncated,
    /// More continuation bytes than the type can hold, or bits beyond its width.
    Overlong,
}

/// Most bytes an encoded `i32` varint can take.
pub const VARINT_BYTES_MAX: usize = 5;
/// Most bytes an encoded `i64` varlong can take.
pub const VARLONG_BYTES_MAX: usize = 10;

/// Appends `value` as a zig-zag varint.
pub fn put_varint(out: &mut Vec<u8>, value: i32) {
    put_unsigned(out, ((value << 1) ^ (value >> 31)) as u32 as u64);
}

/// Appends `value` as a zig-zag varlong.
pub fn put_varlong(out: &mut Vec<u8>, value: i64) {
    put_unsigned(out, ((value << 1) ^ (value >> 63)) as u64);
}

/// The number of bytes [`put_varint`] writes for `value`.
pub fn varint_len(value: i32) -> usize {
    unsigned_len(((value << 1) ^ (value >> 31)) as u32 as u64)
}

/// The number of bytes [`put_varlong`] writes for `value`.
pub fn varlong_len(value: i64) -> usize {
    unsigned_len(((value << 1) ^ (value >> 63)) as u64)
}

fn put_unsigned(out: &mut Vec<u8>, mut raw: u64) {
    while raw >= 0x80 {
        out.push((raw as u8) | 0x80);
        raw >>= 7;
    }
    out.push(raw as u8);
}

fn unsigned_len(raw: u64) -> usize {
    let bits = 64 - raw.leading_zeros() as usize;
    bits.max(1).div_ceil(7)
}

/// Reads a zig-zag varint from the start of `input`; returns it and the bytes used.
///
/// # Errors
/// [`VarintFault::Truncated`] if `input` ends first, [`VarintFault::Overlong`] if the
/// encoding does not fit in 32 bits.
pub fn get_varint(input: &[u8]) -> Result<(i32, usize), VarintFault> {
    let (raw, used) = get_unsigned(input, VARINT_BYTES_MAX)?;
    if raw > u64::from(u32::MAX) {
        return Err(VarintFault::Overlong);
    }
    let raw = raw as u32;
    Ok((((raw >> 1) as i32) ^ -((raw & 1) as i32), used))
}

/// Reads a zig-zag varlong from the start of `input`; returns it and the bytes used.
///
/// # Errors
/// As [`get_varint`], for 64 bits.
pub fn get_varlong(input: &[u8]) -> Result<(i64, usize), VarintFault> {
    let (raw, used) = get_unsigned(input, VARLONG_BYTES_MAX)?;
    Ok((((raw >> 1) as i64) ^ -((raw & 1) as i64), used))
}

fn get_unsigned(input: &[u8], bytes_max: usize) -> Result<(u64, usize), VarintFault> {
    // Record fields are mostly one or two bytes long (deltas, lengths under 16 KiB):
    // take those without the loop.
    match *input {
        [b0, ..] if b0 < 0x80 => return Ok((u64::from(b0), 1)),
        [b0, b1, ..] if b1 < 0x80 => return Ok((u64::from(b0 & 0x7f) | u64::from(b1) << 7, 2)),
        _ => {}
    }
    let mut raw: u64 = 0;
    for (index, &byte) in input.iter().enumerate().take(bytes_max) {
        let shift = 7 * index as u32;
        let group = u64::from(byte & 0x7f);
        // The tenth byte of a varlong may only carry the single top bit.
        if shift == 63 && group > 1 {
            return Err(VarintFault::Overlong);
        }
        raw |= group << shift;
        if byte & 0x80 == 0 {
            return Ok((raw, index + 1));
        }
    }
    if input.len() < bytes_max {
        Err(VarintFault::Truncated)
    } else {
        Err(VarintFault::Overlong)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_encodings_match_kafka() {
        let mut out = Vec::new();
        for (value, bytes) in [
            (0i32, vec![0x00u8]),
            (-1, vec![0x01]),
            (1, vec![0x02]),
            (63, vec![0x7e]),
            (-64, vec![0x7f]),
            (64, vec![0x80, 0x01]),
            (i32::MAX, vec![0xfe, 0xff, 0xff, 0xff, 0x0f]),
            (i32::MIN, vec![0xff, 0xff, 0xff, 0xff, 0x0f]),
        ] {
            out.clear();
            put_varint(&mut out, value);
            assert_eq!(out, bytes, "encoding of {value}");
            assert_eq!(varint_len(value), bytes.len());
            assert_eq!(get_varint(&bytes), Ok((value, bytes.len())));
        }
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert_eq!(get_varint(&[]), Err(VarintFault::Truncated));
        assert_eq!(get_varint(&[0x80, 0x80]), Err(VarintFault::Truncated));
        assert_eq!(get_varint(&[0x80; 6]), Err(VarintFault::Overlong));
        assert_eq!(
            get_varint(&[0xff, 0xff, 0xff, 0xff, 0x1f]),
            Err(VarintFault::Overlong)
        );
        assert_eq!(get_varlong(&[0xff; 10]), Err(VarintFault::Overlong));
    }

    proptest! {
        #[test]
        fn varint_round_trips(value: i32) {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            prop_assert_eq!(out.len(), varint_len(value));
            prop_assert_eq!(get_varint(&out), Ok((value, out.len())));
        }

        #[test]
        fn varlong_round_trips(value: i64) {
            let mut out = Vec::new();
            put_varlong(&mut out, value);
            prop_assert_eq!(out.len(), varlong_len(value));
            prop_assert_eq!(get_varlong(&out), Ok((value, out.len())));
        }
    }
}
