//! A retirement barrier: the partition op that forgets ended client sessions' slice
//! entries and raises the partition's frontier (`docs/architecture.md`, "Retiring
//! ended sessions"). Its body can never be taken for a batch: a batch's body starts
//! with its base offset, which the primary zeroes before it proposes it, and a
//! barrier's with [`BARRIER_MARK`].

/// The first eight bytes of a barrier's body.
pub(crate) const BARRIER_MARK: [u8; 8] = *b"BRDBARR1";

/// The most sessions one barrier names (seed 001: a partition read takes the whole
/// batch, a barrier at most 128 of its sessions).
pub(crate) const BARRIER_SESSIONS_MAX: usize = 128;

/// Forget `sessions`' entries; refuse every session request checked against
/// metadata older than `frontier`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Barrier {
    /// The newest end op of the sessions it retires.
    pub(crate) frontier: u64,
    /// Sessions whose entries go, in id order, at most [`BARRIER_SESSIONS_MAX`].
    pub(crate) sessions: Vec<u64>,
}

impl Barrier {
    /// `BARRIER_MARK, frontier: u64, count: u16, session: u64 * count`, big-endian.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(18 + 8 * self.sessions.len());
        out.extend_from_slice(&BARRIER_MARK);
        out.extend_from_slice(&self.frontier.to_be_bytes());
        out.extend_from_slice(&(self.sessions.len() as u16).to_be_bytes());
        for session in &self.sessions {
            out.extend_from_slice(&session.to_be_bytes());
        }
        out
    }

    /// The barrier a body holds: `None` unless it starts with [`BARRIER_MARK`]
    /// (another op); `Some(Err)` for a marked body that does not decode exactly.
    pub(crate) fn decode(body: &[u8]) -> Option<Result<Self, String>> {
        let rest = body.strip_prefix(&BARRIER_MARK)?;
        Some(Self::decode_fields(rest))
    }

    fn decode_fields(rest: &[u8]) -> Result<Self, String> {
        let (frontier, rest) = rest
            .split_first_chunk::<8>()
            .ok_or("a barrier is cut short before its frontier")?;
        let (count, rest) = rest
            .split_first_chunk::<2>()
            .ok_or("a barrier is cut short before its count")?;
        let count = usize::from(u16::from_be_bytes(*count));
        if count > BARRIER_SESSIONS_MAX || rest.len() != count * 8 {
            return Err(format!(
                "a barrier names {count} sessions in {} bytes (at most \
                 {BARRIER_SESSIONS_MAX}, 8 bytes each)",
                rest.len()
            ));
        }
        let sessions: Vec<u64> = rest
            .chunks_exact(8)
            .map(|chunk| {
                let mut id = [0u8; 8];
                id.copy_from_slice(chunk);
                u64::from_be_bytes(id)
            })
            .collect();
        if sessions.windows(2).any(|pair| pair[0] >= pair[1]) {
            return Err("a barrier's sessions are not in id order".to_owned());
        }
        Ok(Self {
            frontier: u64::from_be_bytes(*frontier),
            sessions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// A barrier reads back as written; bytes after the mark that do not decode
        /// exactly are an error (never a panic), and unmarked bytes are no barrier.
        #[test]
        fn barriers_round_trip_and_other_bytes_are_refused(
            frontier in proptest::prelude::any::<u64>(),
            sessions in proptest::collection::btree_set(1u64.., 0..BARRIER_SESSIONS_MAX),
            junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            let barrier = Barrier { frontier, sessions: sessions.into_iter().collect() };
            let body = barrier.encode();
            proptest::prop_assert_eq!(Barrier::decode(&body), Some(Ok(barrier)));
            for cut in [body.len() - 1, 9, 17] {
                proptest::prop_assert!(matches!(Barrier::decode(&body[..cut]), Some(Err(_))));
            }
            let mut marked = BARRIER_MARK.to_vec();
            marked.extend_from_slice(&junk);
            if let Some(Ok(read)) = Barrier::decode(&marked) {
                proptest::prop_assert_eq!(read.encode(), marked);
            }
            if !junk.starts_with(&BARRIER_MARK) {
                proptest::prop_assert!(Barrier::decode(&junk).is_none());
            }
        }
    }

    #[test]
    fn more_than_128_sessions_or_out_of_order_is_refused() {
        let many = Barrier {
            frontier: 9,
            sessions: (1..=129).collect(),
        };
        assert!(matches!(Barrier::decode(&many.encode()), Some(Err(_))));
        let unordered = Barrier {
            frontier: 9,
            sessions: vec![5, 3],
        };
        assert!(matches!(Barrier::decode(&unordered.encode()), Some(Err(_))));
    }
}
