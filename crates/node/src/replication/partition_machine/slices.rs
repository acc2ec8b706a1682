//! Client sessions in a partition: for each session that produced here, its *slice
//! entry*, the last requests applied (up to [`SLICE_WINDOW`], the newest last) and the
//! offsets each took, so a producer that resends every batch it had in flight after a
//! failover is answered each one's offsets. A produce names its
//! session and request in the batch header (producer id = session, base sequence =
//! request number, numbered from 0 per session and partition), and the primary asks
//! [`Slices::admit`] before it prepares one, since the log is the journal: anything
//! prepared is stored, so a duplicate must be refused before, never undone after.

use std::collections::BTreeMap;

use braid_proto::BatchHeader;

/// Requests of a session whose offsets a partition keeps: as many as the SDK keeps in
/// flight, so each of its resends is answered with offsets.
pub(crate) const SLICE_WINDOW: usize = 8;

/// A produce's session and request number, read from its batch header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct SessionTag {
    /// The session id (the metadata op that registered it, so never 0).
    pub(crate) session: u64,
    /// The request number within the session, on this partition.
    pub(crate) request: u32,
    /// The batch's CRC (over its records and producer fields): a request sent again
    /// must be the same batch.
    pub(crate) crc: u32,
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
                crc: header.crc,
            }),
            _ => Tagged::Invalid,
        }
    }
}

/// A request of a session applied in this partition and the offsets it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slice {
    pub(crate) request: u32,
    pub(crate) base: u64,
    pub(crate) last: u64,
    /// The stored batch's CRC (`None` in entries written before it was kept).
    pub(crate) crc: Option<u32>,
}

/// What the primary does with a session's produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// The session's next request: prepare it.
    New,
    /// One of the session's last requests applied here (a retry): answer its
    /// offsets, store nothing.
    Stored { base: u64, last: u64 },
    /// One of the session's last requests applied here, but with other records (its
    /// CRC `stored`): a request number reused, refused (the other batch was stored).
    Differs { stored: u32 },
    /// A request of the session that is prepared and not yet applied: wait for it,
    /// then answer from its entry.
    InFlight,
    /// Older than the requests kept: stored before, its offsets no longer kept.
    Older { last: u32 },
    /// Past the next request number: an earlier request is missing.
    Gap { expected: u32 },
}

/// Every session's slice entry in one partition, by session id: its last requests,
/// oldest first, each number above the one before; and the partition's retirement
/// frontier.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Slices {
    /// Boxed, and made at the first session's request or barrier: most partitions
    /// hold none, and an idle replica's every byte counts (an empty map inline is 24,
    /// the box 8; as `braid_vsr` keeps its busy-only collections).
    entries: Option<Box<Entries>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Entries {
    /// The newest metadata op a barrier named: entries of sessions ended at or below
    /// it were dropped, so no request checked against older metadata is admitted.
    frontier: u64,
    sessions: BTreeMap<u64, Vec<Slice>>,
}

impl Slices {
    fn window(&self, session: u64) -> &[Slice] {
        self.entries
            .as_deref()
            .and_then(|entries| entries.sessions.get(&session))
            .map_or(&[], Vec::as_slice)
    }

    /// The metadata op a session's request must have been checked at, or after, to
    /// be admitted here (0 until a barrier).
    pub(crate) fn frontier(&self) -> u64 {
        self.entries
            .as_deref()
            .map_or(0, |entries| entries.frontier)
    }

    /// Whether `session` holds an entry here.
    pub(crate) fn holds(&self, session: u64) -> bool {
        !self.window(session).is_empty()
    }

    /// The sessions holding an entry, in id order.
    pub(crate) fn sessions(&self) -> impl Iterator<Item = u64> + '_ {
        self.entries
            .as_deref()
            .into_iter()
            .flat_map(|entries| entries.sessions.keys().copied())
    }

    /// A barrier: drops the entries of `sessions` and raises the frontier to
    /// `frontier` (never lowers it). The box goes once nothing is left in it.
    pub(crate) fn retire(&mut self, frontier: u64, sessions: &[u64]) {
        let entries = self.entries.get_or_insert_with(Box::default);
        entries.frontier = entries.frontier.max(frontier);
        for session in sessions {
            entries.sessions.remove(session);
        }
        if entries.frontier == 0 && entries.sessions.is_empty() {
            self.entries = None;
        }
    }

    /// Sets the frontier a state's encoding carried beside the entries.
    pub(crate) fn set_frontier(&mut self, frontier: u64) {
        self.retire(frontier, &[]);
    }

    /// What to do with `tag`, given the highest request of its session the primary has
    /// prepared and not yet applied (`prepared`, if any).
    pub(crate) fn admit(&self, tag: SessionTag, prepared: Option<u32>) -> Admission {
        let applied = self.window(tag.session);
        let applied_request = applied.last().map(|slice| slice.request);
        let prepared = prepared.filter(|p| applied_request.is_none_or(|a| *p > a));
        let top = prepared.or(applied_request);
        let expected = top.map_or(Some(0), |top| top.checked_add(1));
        match expected {
            Some(expected) if tag.request == expected => return Admission::New,
            Some(expected) if tag.request > expected => return Admission::Gap { expected },
            _ => {}
        }
        if let Some(slice) = applied.iter().find(|slice| slice.request == tag.request) {
            return match slice.crc {
                Some(stored) if stored != tag.crc => Admission::Differs { stored },
                _ => Admission::Stored {
                    base: slice.base,
                    last: slice.last,
                },
            };
        }
        match applied_request {
            Some(last) if tag.request < last => Admission::Older { last },
            // At or below a prepared request and above the last applied one.
            _ => Admission::InFlight,
        }
    }

    /// Records that `tag`'s batch took `base..=last`. A request at or below the
    /// session's last is stored all the same (the log is the journal) but leaves the
    /// entry as it was: the primary admits none, so a committed one is a bug the
    /// shell simulator's end check names.
    pub(crate) fn applied(&mut self, tag: SessionTag, base: u64, last: u64) {
        let window = self
            .entries
            .get_or_insert_with(Box::default)
            .sessions
            .entry(tag.session)
            .or_default();
        if window
            .last()
            .is_some_and(|slice| slice.request >= tag.request)
        {
            return;
        }
        if window.len() == SLICE_WINDOW {
            window.remove(0);
        }
        window.push(Slice {
            request: tag.request,
            base,
            last,
            crc: Some(tag.crc),
        });
    }

    /// The last request of `session` applied here, if it produced here.
    #[cfg(test)]
    pub(crate) fn get(&self, session: u64) -> Option<&Slice> {
        self.window(session).last()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries
            .as_deref()
            .map_or(0, |entries| entries.sessions.len())
    }

    /// Appends `count: u32`, then for each session in id order `session: u64, kept:
    /// u8` (1 to [`SLICE_WINDOW`]) and its requests oldest first, each `request: u32,
    /// base: u64, last: u64, crc: u32`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let sessions = self.entries.as_deref().map(|entries| &entries.sessions);
        out.extend_from_slice(&(sessions.map_or(0, BTreeMap::len) as u32).to_be_bytes());
        for (session, window) in sessions.into_iter().flatten() {
            out.extend_from_slice(&session.to_be_bytes());
            out.push(window.len() as u8);
            for slice in window {
                out.extend_from_slice(&slice.request.to_be_bytes());
                out.extend_from_slice(&slice.base.to_be_bytes());
                out.extend_from_slice(&slice.last.to_be_bytes());
                out.extend_from_slice(&slice.crc.unwrap_or(0).to_be_bytes());
            }
        }
    }

    /// Reads what [`Slices::encode`] wrote, filling `bytes` exactly; `with_crc`:
    /// false for the encoding before entries kept their batch's CRC.
    pub(crate) fn decode(bytes: &[u8], with_crc: bool) -> Result<Self, String> {
        let mut r = Reader(bytes);
        let count = r.u32()?;
        let mut entries = BTreeMap::new();
        for _ in 0..count {
            let session = r.u64()?;
            let kept = usize::from(r.u8()?);
            if session == 0 || !(1..=SLICE_WINDOW).contains(&kept) {
                return Err(format!(
                    "a partition state's session {session} keeps {kept} requests"
                ));
            }
            if entries.last_key_value().is_some_and(|(s, _)| *s >= session) {
                return Err(format!(
                    "a partition state's session {session} is out of order"
                ));
            }
            let mut window: Vec<Slice> = Vec::with_capacity(kept);
            for _ in 0..kept {
                let slice = Slice {
                    request: r.u32()?,
                    base: r.u64()?,
                    last: r.u64()?,
                    crc: if with_crc { Some(r.u32()?) } else { None },
                };
                if slice.last < slice.base
                    || window
                        .last()
                        .is_some_and(|before| before.request >= slice.request)
                {
                    return Err(format!(
                        "a partition state's request {} of session {session} at {}..={} is \
                         impossible",
                        slice.request, slice.base, slice.last
                    ));
                }
                window.push(slice);
            }
            entries.insert(session, window);
        }
        if !r.0.is_empty() {
            return Err(format!(
                "a partition state has {} bytes after its sessions",
                r.0.len()
            ));
        }
        Ok(Self {
            entries: (!entries.is_empty()).then(|| {
                Box::new(Entries {
                    frontier: 0,
                    sessions: entries,
                })
            }),
        })
    }
}

/// Big-endian fields read off the front of a slice, each refused when cut short.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let (field, rest) = self
            .0
            .split_first_chunk::<N>()
            .ok_or("a partition state's sessions are cut short")?;
        self.0 = rest;
        Ok(*field)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        self.take().map(u32::from_be_bytes)
    }
    fn u64(&mut self) -> Result<u64, String> {
        self.take().map(u64::from_be_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(session: u64, request: u32) -> SessionTag {
        SessionTag {
            session,
            request,
            crc: 7,
        }
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
        assert_eq!(
            slices.admit(tag(5, 0), None),
            Admission::Stored { base: 10, last: 12 },
            "an earlier request within the window"
        );
        for request in 2..=SLICE_WINDOW as u32 {
            slices.applied(tag(5, request), 14, 14);
        }
        assert_eq!(
            slices.admit(tag(5, 0), None),
            Admission::Older {
                last: SLICE_WINDOW as u32
            },
            "past the window"
        );
        assert_eq!(
            slices.admit(tag(5, 1), None),
            Admission::Stored { base: 13, last: 13 }
        );
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
                last: 1,
                crc: Some(7),
            }),
            "a second copy changes no entry"
        );
    }

    /// A request number sent again with other records is refused: the batch stored
    /// under it stays, and the new one is not taken for it.
    #[test]
    fn a_request_number_reused_for_other_records_is_refused() {
        let mut slices = Slices::default();
        slices.applied(tag(5, 0), 0, 0);
        let other = SessionTag {
            crc: 8,
            ..tag(5, 0)
        };
        assert_eq!(slices.admit(other, None), Admission::Differs { stored: 7 });
        assert_eq!(
            slices.admit(tag(5, 0), None),
            Admission::Stored { base: 0, last: 0 }
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
        let built = header(&builder);
        assert_eq!(
            SessionTag::of(&built),
            Tagged::Yes(SessionTag {
                crc: built.crc,
                ..tag(9, 4)
            })
        );
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
            entries in proptest::collection::btree_map(1u64.., proptest::collection::vec((proptest::prelude::any::<u32>(), 0u64..1 << 40, 0u64..1 << 20), 1..12), 0..20),
            junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80),
        ) {
            let mut slices = Slices::default();
            for (session, requests) in &entries {
                for (request, base, count) in requests {
                    slices.applied(tag(*session, *request), *base, base + count);
                }
            }
            let mut out = Vec::new();
            slices.encode(&mut out);
            proptest::prop_assert_eq!(Slices::decode(&out, true), Ok(slices.clone()));
            for cut in 0..out.len() {
                proptest::prop_assert!(Slices::decode(&out[..cut], true).is_err());
            }
            if let Ok(read) = Slices::decode(&junk, true) {
                let mut again = Vec::new();
                read.encode(&mut again);
                proptest::prop_assert_eq!(again, junk);
            }
        }
    }
}
