//! Client sessions in a partition: for each session that produced here, its *slice
//! entry*, the last request applied and the offsets it took. A produce names its
//! session and request in the batch header (producer id = session, base sequence =
//! request number, numbered from 0 per session and partition), and the primary asks
//! [`Slices::admit`] before it prepares one, since the log is the journal: anything
//! prepared is stored, so a duplicate must be refused before, never undone after.

use std::collections::BTreeMap;

use braid_proto::BatchHeader;

/// A produce's session and request number, read from its batch header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct SessionTag {
    /// The session id (the metadata op that registered it, so never 0).
    pub(crate) session: u64,
    /// The request number within the session, on this partition.
    pub(crate) request: u32,
}

/// How a batch header names (or does not name) a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tagged {
    /// No session: producer id and base sequence both -1.
    No,
    /// A session's request.
    Yes(SessionTag),
    /// Anything else (a session without a request number, a negative id): refused at
    /// the door, and applied as an untagged batch should one ever be committed.
    Invalid,
}

impl SessionTag {
    /// The tag a batch header carries.
    pub(crate) fn of(header: &BatchHeader) -> Tagged {
        match (header.producer_id, header.base_sequence) {
            (-1, -1) => Tagged::No,
            (session, request) if session > 0 && request >= 0 => Tagged::Yes(Self {
                session: session as u64,
                request: request as u32,
            }),
            _ => Tagged::Invalid,
        }
    }
}

/// A session's last request applied in this partition and the offsets it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slice {
    pub(crate) request: u32,
    pub(crate) base: u64,
    pub(crate) last: u64,
}

/// What the primary does with a session's produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// The session's next request: prepare it.
    New,
    /// The session's last request applied here (a retry): answer its offsets, store
    /// nothing.
    Stored { base: u64, last: u64 },
    /// A request of the session that is prepared and not yet applied: wait for it,
    /// then answer from its entry.
    InFlight,
    /// Older than the last request applied: stored before, its offsets no longer kept.
    Older { last: u32 },
    /// Past the next request number: an earlier request is missing.
    Gap { expected: u32 },
}

/// Every session's slice entry in one partition, by session id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Slices {
    entries: BTreeMap<u64, Slice>,
}

impl Slices {
    /// What to do with `tag`, given the highest request of its session the primary has
    /// prepared and not yet applied (`prepared`, if any).
    pub(crate) fn admit(&self, tag: SessionTag, prepared: Option<u32>) -> Admission {
        let applied = self.entries.get(&tag.session);
        let applied_request = applied.map(|slice| slice.request);
        let prepared = prepared.filter(|p| applied_request.is_none_or(|a| *p > a));
        let top = prepared.or(applied_request);
        let expected = top.map_or(Some(0), |top| top.checked_add(1));
        match expected {
            Some(expected) if tag.request == expected => return Admission::New,
            Some(expected) if tag.request > expected => return Admission::Gap { expected },
            _ => {}
        }
        match applied {
            Some(slice) if tag.request == slice.request => Admission::Stored {
                base: slice.base,
                last: slice.last,
            },
            Some(slice) if tag.request < slice.request => Admission::Older {
                last: slice.request,
            },
            // At or below a prepared request and above the last applied one.
            _ => Admission::InFlight,
        }
    }

    /// Records that `tag`'s batch took `base..=last`. A request at or below the
    /// session's last is stored all the same (the log is the journal) but leaves the
    /// entry as it was: the primary admits none, so a committed one is a bug the
    /// shell simulator's end check names.
    pub(crate) fn applied(&mut self, tag: SessionTag, base: u64, last: u64) {
        let slice = Slice {
            request: tag.request,
            base,
            last,
        };
        self.entries
            .entry(tag.session)
            .and_modify(|entry| {
                if tag.request > entry.request {
                    *entry = slice;
                }
            })
            .or_insert(slice);
    }

    /// The entry of `session`, if it produced here.
    #[cfg(test)]
    pub(crate) fn get(&self, session: u64) -> Option<&Slice> {
        self.entries.get(&session)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Appends `count: u32`, then `session: u64, request: u32, base: u64, last: u64`
    /// for each entry in session order.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.entries.len() as u32).to_be_bytes());
        for (session, slice) in &self.entries {
            out.extend_from_slice(&session.to_be_bytes());
            out.extend_from_slice(&slice.request.to_be_bytes());
            out.extend_from_slice(&slice.base.to_be_bytes());
            out.extend_from_slice(&slice.last.to_be_bytes());
        }
    }

    /// Reads what [`Slices::encode`] wrote, filling `bytes` exactly.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, String> {
        const ENTRY: usize = 8 + 4 + 8 + 8;
        let (count, rest) = bytes
            .split_first_chunk::<4>()
            .ok_or("a partition state's session count is cut short")?;
        let count = u32::from_be_bytes(*count) as usize;
        if rest.len() != count.saturating_mul(ENTRY) {
            return Err(format!(
                "a partition state names {count} sessions in {} bytes",
                rest.len()
            ));
        }
        let mut entries = BTreeMap::new();
        for raw in rest.chunks_exact(ENTRY) {
            let (session, raw) = raw.split_at(8);
            let (request, raw) = raw.split_at(4);
            let (base, last) = raw.split_at(8);
            let session = u64::from_be_bytes(session.try_into().map_err(|_| "cut")?);
            let slice = Slice {
                request: u32::from_be_bytes(request.try_into().map_err(|_| "cut")?),
                base: u64::from_be_bytes(base.try_into().map_err(|_| "cut")?),
                last: u64::from_be_bytes(last.try_into().map_err(|_| "cut")?),
            };
            if session == 0 || slice.last < slice.base {
                return Err(format!(
                    "a partition state's session entry {session} at {}..={} is impossible",
                    slice.base, slice.last
                ));
            }
            if entries.last_key_value().is_some_and(|(s, _)| *s >= session) {
                return Err(format!(
                    "a partition state's session {session} is out of order"
                ));
            }
            entries.insert(session, slice);
        }
        Ok(Self { entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(session: u64, request: u32) -> SessionTag {
        SessionTag { session, request }
    }

    #[test]
    fn a_session_starts_at_request_zero_and_goes_one_by_one() {
        let mut slices = Slices::default();
        assert_eq!(slices.admit(tag(5, 0), None), Admission::New);
        assert_eq!(
            slices.admit(tag(5, 1), None),
            Admission::Gap { expected: 0 }
        );
        slices.applied(tag(5, 0), 10, 12);
        assert_eq!(slices.admit(tag(5, 1), None), Admission::New);
        assert_eq!(
            slices.admit(tag(5, 0), None),
            Admission::Stored { base: 10, last: 12 },
            "a retry of the last gets its offsets"
        );
        slices.applied(tag(5, 1), 13, 13);
        assert_eq!(slices.admit(tag(5, 0), None), Admission::Older { last: 1 });
        assert_eq!(
            slices.admit(tag(6, 0), None),
            Admission::New,
            "sessions apart"
        );
    }

    #[test]
    fn prepared_requests_count_until_applied() {
        let mut slices = Slices::default();
        slices.applied(tag(5, 3), 0, 0);
        // 4 and 5 prepared, not applied.
        assert_eq!(slices.admit(tag(5, 6), Some(5)), Admission::New);
        assert_eq!(slices.admit(tag(5, 4), Some(5)), Admission::InFlight);
        assert_eq!(slices.admit(tag(5, 5), Some(5)), Admission::InFlight);
        assert_eq!(
            slices.admit(tag(5, 7), Some(5)),
            Admission::Gap { expected: 6 }
        );
        assert_eq!(
            slices.admit(tag(5, 3), Some(5)),
            Admission::Stored { base: 0, last: 0 }
        );
        // A prepared number at or below the applied one is stale and ignored.
        assert_eq!(slices.admit(tag(5, 4), Some(3)), Admission::New);
        slices.applied(tag(5, 4), 1, 1);
        slices.applied(tag(5, 4), 2, 2);
        assert_eq!(
            slices.get(5),
            Some(&Slice {
                request: 4,
                base: 1,
                last: 1
            }),
            "a second copy changes no entry"
        );
    }

    #[test]
    fn the_last_request_number_has_no_next() {
        let mut slices = Slices::default();
        slices.applied(tag(5, u32::MAX), 0, 0);
        assert_eq!(
            slices.admit(tag(5, u32::MAX), None),
            Admission::Stored { base: 0, last: 0 }
        );
        assert_eq!(
            slices.admit(tag(5, 0), None),
            Admission::Older { last: u32::MAX }
        );
    }

    #[test]
    fn tags_come_from_the_producer_fields() {
        let mut builder = braid_proto::BatchBuilder::new(0);
        builder.push(None, Some(b"v"), &[], 0);
        let header = |b: &braid_proto::BatchBuilder| {
            BatchHeader::decode(&b.clone().finish()).expect("a built batch")
        };
        assert_eq!(SessionTag::of(&header(&builder)), Tagged::No);
        builder.producer(9, -1, 4);
        assert_eq!(SessionTag::of(&header(&builder)), Tagged::Yes(tag(9, 4)));
        builder.producer(9, -1, -1);
        assert_eq!(SessionTag::of(&header(&builder)), Tagged::Invalid);
        builder.producer(0, -1, 0);
        assert_eq!(SessionTag::of(&header(&builder)), Tagged::Invalid);
    }

    proptest::proptest! {
        /// Entries read back as written; any other bytes are refused or read back
        /// to exactly themselves (never a panic).
        #[test]
        fn entries_round_trip(
            entries in proptest::collection::btree_map(1u64.., (proptest::prelude::any::<u32>(), 0u64..1 << 40, 0u64..1 << 20), 0..20),
            junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80),
        ) {
            let mut slices = Slices::default();
            for (session, (request, base, count)) in &entries {
                slices.applied(tag(*session, *request), *base, base + count);
            }
            let mut out = Vec::new();
            slices.encode(&mut out);
            proptest::prop_assert_eq!(Slices::decode(&out), Ok(slices.clone()));
            for cut in 0..out.len() {
                proptest::prop_assert!(Slices::decode(&out[..cut]).is_err());
            }
            if let Ok(read) = Slices::decode(&junk) {
                let mut again = Vec::new();
                read.encode(&mut again);
                proptest::prop_assert_eq!(again, junk);
            }
        }
    }
}
