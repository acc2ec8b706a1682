//! The wire form of [`Message`]: what replicas send each other over the replica bus
//! (the bus frame carries the group). Fixed-width big-endian fields; a message is a
//! kind byte and its fields, and decoding is strict (every header's checksum checked,
//! every count bounded by the bytes left, nothing left over), so a peer's bytes are
//! either a whole message or a typed error, never a panic.

use crate::durable::{Checkpoint, DecodeError, Reader};
use crate::message::{Header, Message, Prepare, Refusal, Reply, Request, SuffixEntry};

const WHAT: &str = "message";

const REQUEST: u8 = 1;
const PREPARE: u8 = 2;
const PREPARE_OK: u8 = 3;
const COMMIT: u8 = 4;
const START_VIEW_CHANGE: u8 = 5;
const DO_VIEW_CHANGE: u8 = 6;
const START_VIEW: u8 = 7;
const REQUEST_PREPARE: u8 = 8;
const REQUEST_START_VIEW: u8 = 9;
const COMMITTED: u8 = 10;
const REQUEST_SNAPSHOT: u8 = 11;
const SNAPSHOT: u8 = 12;
const REQUEST_VIEWS: u8 = 13;
const VIEWS: u8 = 14;

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_u128(out: &mut Vec<u8>, v: u128) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn put_suffix(out: &mut Vec<u8>, suffix: &[SuffixEntry]) {
    out.extend_from_slice(&(suffix.len() as u32).to_be_bytes());
    for entry in suffix {
        out.extend_from_slice(&entry.header.encode());
        match &entry.body {
            Some(body) => {
                out.push(1);
                put_bytes(out, body);
            }
            None => out.push(0),
        }
    }
}

fn bytes<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], DecodeError> {
    let len = r.u32()? as usize;
    r.take(len)
}

fn header(r: &mut Reader<'_>) -> Result<Header, DecodeError> {
    Header::decode(r.take(Header::ENCODED_BYTES)?)
}

/// A count of items of at least `item_bytes` each, refused if they cannot fit.
fn count(r: &mut Reader<'_>, item_bytes: usize) -> Result<usize, DecodeError> {
    let count = r.u32()? as usize;
    if count.saturating_mul(item_bytes) > r.remaining() {
        return Err(DecodeError::InvalidField {
            what: WHAT,
            field: "count",
        });
    }
    Ok(count)
}

/// How a decoded body is held: copied out of the wire bytes, or a shared slice of them.
type Share<'a> = &'a dyn Fn(&[u8]) -> bytes::Bytes;

fn suffix(r: &mut Reader<'_>, share: Share<'_>) -> Result<Vec<SuffixEntry>, DecodeError> {
    (0..count(r, Header::ENCODED_BYTES + 1)?)
        .map(|_| {
            let header = header(r)?;
            let body = match r.u8()? {
                0 => None,
                1 => Some(share(bytes(r)?)),
                _ => {
                    return Err(DecodeError::InvalidField {
                        what: WHAT,
                        field: "body flag",
                    })
                }
            };
            Ok(SuffixEntry { header, body })
        })
        .collect()
}

impl Message {
    /// Appends the message's wire form.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::Request(request) => {
                out.push(REQUEST);
                put_u64(out, request.client);
                put_u64(out, request.session);
                put_u64(out, request.request);
                put_bytes(out, &request.body);
            }
            Self::Prepare(prepare) => {
                out.push(PREPARE);
                out.extend_from_slice(&prepare.header.encode());
                put_bytes(out, &prepare.body);
            }
            Self::PrepareOk {
                view,
                op,
                checksum,
                from,
            } => {
                out.push(PREPARE_OK);
                put_u64(out, *view);
                put_u64(out, *op);
                put_u128(out, *checksum);
                out.push(*from);
            }
            Self::Commit {
                view,
                commit,
                checksum,
                from,
            }
            | Self::Committed {
                view,
                commit,
                checksum,
                from,
            } => {
                out.push(if matches!(self, Self::Commit { .. }) {
                    COMMIT
                } else {
                    COMMITTED
                });
                put_u64(out, *view);
                put_u64(out, *commit);
                put_u128(out, *checksum);
                out.push(*from);
            }
            Self::StartViewChange { view, from } | Self::RequestStartView { view, from } => {
                out.push(if matches!(self, Self::StartViewChange { .. }) {
                    START_VIEW_CHANGE
                } else {
                    REQUEST_START_VIEW
                });
                put_u64(out, *view);
                out.push(*from);
            }
            Self::DoViewChange {
                view,
                log_view,
                op,
                commit,
                commit_checksum,
                suffix,
                faulty,
                trusted_through,
                from,
            } => {
                out.push(DO_VIEW_CHANGE);
                for v in [*view, *log_view, *op, *commit] {
                    put_u64(out, v);
                }
                match commit_checksum {
                    Some(checksum) => {
                        out.push(1);
                        put_u128(out, *checksum);
                    }
                    None => out.push(0),
                }
                put_suffix(out, suffix);
                out.extend_from_slice(&(faulty.len() as u32).to_be_bytes());
                for op in faulty {
                    put_u64(out, *op);
                }
                put_u64(out, *trusted_through);
                out.push(*from);
            }
            Self::StartView {
                view,
                op,
                commit,
                suffix,
                from,
            } => {
                out.push(START_VIEW);
                for v in [*view, *op, *commit] {
                    put_u64(out, v);
                }
                put_suffix(out, suffix);
                out.push(*from);
            }
            Self::RequestPrepare { op, checksum, from } => {
                out.push(REQUEST_PREPARE);
                put_u64(out, *op);
                put_u128(out, *checksum);
                out.push(*from);
            }
            Self::RequestSnapshot { from } => {
                out.push(REQUEST_SNAPSHOT);
                out.push(*from);
            }
            Self::RequestViews { from, nonce } => {
                out.push(REQUEST_VIEWS);
                out.push(*from);
                put_u64(out, *nonce);
            }
            Self::Views {
                view,
                primary_op,
                from,
                nonce,
            } => {
                out.push(VIEWS);
                put_u64(out, *view);
                // u64::MAX: not the normal primary (no log reaches that op).
                put_u64(out, primary_op.unwrap_or(u64::MAX));
                out.push(*from);
                put_u64(out, *nonce);
            }
            Self::Snapshot {
                checkpoint,
                view,
                from,
            } => {
                out.push(SNAPSHOT);
                put_bytes(out, &checkpoint.encode());
                put_u64(out, *view);
                out.push(*from);
            }
        }
    }

    /// Reads a message written by [`Message::encode`] that fills `bytes` exactly.
    ///
    /// # Errors
    /// A [`DecodeError`]: cut, trailing bytes, an unknown kind, a header or checkpoint
    /// whose checksum fails, a count larger than the bytes could hold.
    pub fn decode(wire: &[u8]) -> Result<Self, DecodeError> {
        Self::decode_with(wire, &bytes::Bytes::copy_from_slice)
    }

    /// As [`Message::decode`], but request and prepare bodies (and view-change suffix
    /// bodies) are slices of `wire`, not copies: a received prepare's batch goes to the
    /// journal in the buffer it arrived in.
    ///
    /// # Errors
    /// As [`Message::decode`].
    pub fn decode_shared(wire: &bytes::Bytes) -> Result<Self, DecodeError> {
        // Every body is a subslice of `wire` taken by the reader, so `slice_ref` holds.
        Self::decode_with(wire, &|body| wire.slice_ref(body))
    }

    fn decode_with(wire: &[u8], share: Share<'_>) -> Result<Self, DecodeError> {
        let mut r = Reader::new(WHAT, wire);
        let message = match r.u8()? {
            REQUEST => Self::Request(Request {
                client: r.u64()?,
                session: r.u64()?,
                request: r.u64()?,
                body: share(bytes(&mut r)?),
            }),
            PREPARE => Self::Prepare(Prepare {
                header: header(&mut r)?,
                body: share(bytes(&mut r)?),
            }),
            PREPARE_OK => Self::PrepareOk {
                view: r.u64()?,
                op: r.u64()?,
                checksum: r.u128()?,
                from: r.u8()?,
            },
            kind @ (COMMIT | COMMITTED) => {
                let (view, commit, checksum, from) = (r.u64()?, r.u64()?, r.u128()?, r.u8()?);
                if kind == COMMIT {
                    Self::Commit {
                        view,
                        commit,
                        checksum,
                        from,
                    }
                } else {
                    Self::Committed {
                        view,
                        commit,
                        checksum,
                        from,
                    }
                }
            }
            kind @ (START_VIEW_CHANGE | REQUEST_START_VIEW) => {
                let (view, from) = (r.u64()?, r.u8()?);
                if kind == START_VIEW_CHANGE {
                    Self::StartViewChange { view, from }
                } else {
                    Self::RequestStartView { view, from }
                }
            }
            DO_VIEW_CHANGE => {
                let (view, log_view, op, commit) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
                let commit_checksum = match r.u8()? {
                    0 => None,
                    1 => Some(r.u128()?),
                    _ => {
                        return Err(DecodeError::InvalidField {
                            what: WHAT,
                            field: "commit checksum flag",
                        })
                    }
                };
                let suffix = suffix(&mut r, share)?;
                let faulty = (0..count(&mut r, 8)?)
                    .map(|_| r.u64())
                    .collect::<Result<_, _>>()?;
                Self::DoViewChange {
                    view,
                    log_view,
                    op,
                    commit,
                    commit_checksum,
                    suffix,
                    faulty,
                    trusted_through: r.u64()?,
                    from: r.u8()?,
                }
            }
            START_VIEW => Self::StartView {
                view: r.u64()?,
                op: r.u64()?,
                commit: r.u64()?,
                suffix: suffix(&mut r, share)?,
                from: r.u8()?,
            },
            REQUEST_PREPARE => Self::RequestPrepare {
                op: r.u64()?,
                checksum: r.u128()?,
                from: r.u8()?,
            },
            REQUEST_SNAPSHOT => Self::RequestSnapshot { from: r.u8()? },
            REQUEST_VIEWS => Self::RequestViews {
                from: r.u8()?,
                nonce: r.u64()?,
            },
            VIEWS => Self::Views {
                view: r.u64()?,
                primary_op: Some(r.u64()?).filter(|op| *op != u64::MAX),
                from: r.u8()?,
                nonce: r.u64()?,
            },
            SNAPSHOT => Self::Snapshot {
                checkpoint: Checkpoint::decode(bytes(&mut r)?)?,
                view: r.u64()?,
                from: r.u8()?,
            },
            _ => {
                return Err(DecodeError::InvalidField {
                    what: WHAT,
                    field: "kind",
                })
            }
        };
        r.finish()?;
        Ok(message)
    }
}

fn bytes_owned(r: &mut Reader<'_>) -> Result<Vec<u8>, DecodeError> {
    bytes(r).map(<[u8]>::to_vec)
}

/// A reply's result: 0 and the bytes, or 1 and a refusal (1 session unknown, 2 request
/// too old).
const RESULT_OK: u8 = 0;
const RESULT_REFUSED: u8 = 1;

impl Reply {
    /// Appends the reply's wire form (a primary answering a client on another node).
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_u64(out, self.client);
        put_u64(out, self.session);
        put_u64(out, self.request);
        out.push(u8::from(self.register));
        put_u64(out, self.view);
        match &self.result {
            Ok(bytes) => {
                out.push(RESULT_OK);
                put_bytes(out, bytes);
            }
            Err(refusal) => {
                out.push(RESULT_REFUSED);
                out.push(match refusal {
                    Refusal::SessionUnknown => 1,
                    Refusal::RequestTooOld => 2,
                });
            }
        }
    }

    /// Reads a reply written by [`Reply::encode`] that fills `wire` exactly.
    ///
    /// # Errors
    /// A [`DecodeError`]: cut, trailing bytes, an unknown flag.
    pub fn decode(wire: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new("reply", wire);
        let invalid = |field| DecodeError::InvalidField {
            what: "reply",
            field,
        };
        let (client, session, request) = (r.u64()?, r.u64()?, r.u64()?);
        let register = match r.u8()? {
            0 => false,
            1 => true,
            _ => return Err(invalid("register flag")),
        };
        let view = r.u64()?;
        let result = match r.u8()? {
            RESULT_OK => Ok(bytes_owned(&mut r)?),
            RESULT_REFUSED => Err(match r.u8()? {
                1 => Refusal::SessionUnknown,
                2 => Refusal::RequestTooOld,
                _ => return Err(invalid("refusal")),
            }),
            _ => return Err(invalid("result flag")),
        };
        r.finish()?;
        Ok(Self {
            client,
            session,
            request,
            register,
            view,
            result,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{checksum, Operation};
    use proptest::prelude::*;

    fn header(op: u64, view: u64) -> Header {
        Header {
            group: 3,
            view,
            op,
            commit: op.saturating_sub(1),
            parent: u128::from(op) * 7,
            body_checksum: checksum(&op.to_be_bytes()),
            session: 1,
            request: op,
            operation: Operation::Request,
            checksum: 0,
        }
        .seal()
    }

    fn suffix_entry() -> impl Strategy<Value = SuffixEntry> {
        (
            0u64..100,
            0u64..5,
            prop::option::of(prop::collection::vec(any::<u8>(), 0..20)),
        )
            .prop_map(|(op, view, body)| SuffixEntry {
                header: header(op, view),
                body: body.map(Into::into),
            })
    }

    fn message() -> impl Strategy<Value = Message> {
        let small = prop::collection::vec(any::<u8>(), 0..40);
        prop_oneof![
            (any::<u64>(), any::<u64>(), any::<u64>(), small.clone()).prop_map(
                |(client, session, request, body)| Message::Request(Request {
                    client,
                    session,
                    request,
                    body: body.into(),
                })
            ),
            (0u64..100, small.clone()).prop_map(|(op, body)| Message::Prepare(Prepare {
                header: header(op, 1),
                body: body.into(),
            })),
            (any::<u64>(), any::<u64>(), any::<u128>(), any::<u8>()).prop_map(
                |(view, op, checksum, from)| Message::PrepareOk {
                    view,
                    op,
                    checksum,
                    from
                }
            ),
            (any::<u64>(), any::<u64>(), any::<u128>(), any::<u8>()).prop_map(
                |(view, commit, checksum, from)| Message::Commit {
                    view,
                    commit,
                    checksum,
                    from
                }
            ),
            (any::<u64>(), any::<u64>(), any::<u128>(), any::<u8>()).prop_map(
                |(view, commit, checksum, from)| Message::Committed {
                    view,
                    commit,
                    checksum,
                    from
                }
            ),
            (any::<u64>(), any::<u8>())
                .prop_map(|(view, from)| Message::StartViewChange { view, from }),
            (any::<u64>(), any::<u8>())
                .prop_map(|(view, from)| Message::RequestStartView { view, from }),
            (
                (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
                prop::option::of(any::<u128>()),
                prop::collection::vec(suffix_entry(), 0..4),
                prop::collection::vec(any::<u64>(), 0..4),
                any::<u64>(),
                any::<u8>()
            )
                .prop_map(
                    |(
                        (view, log_view, op, commit),
                        commit_checksum,
                        suffix,
                        faulty,
                        trusted_through,
                        from,
                    )| {
                        Message::DoViewChange {
                            view,
                            log_view,
                            op,
                            commit,
                            commit_checksum,
                            suffix,
                            faulty,
                            trusted_through,
                            from,
                        }
                    }
                ),
            (
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                prop::collection::vec(suffix_entry(), 0..4),
                any::<u8>()
            )
                .prop_map(|(view, op, commit, suffix, from)| Message::StartView {
                    view,
                    op,
                    commit,
                    suffix,
                    from
                }),
            (any::<u64>(), any::<u128>(), any::<u8>())
                .prop_map(|(op, checksum, from)| Message::RequestPrepare { op, checksum, from }),
            any::<u8>().prop_map(|from| Message::RequestSnapshot { from }),
            (any::<u8>(), any::<u64>())
                .prop_map(|(from, nonce)| Message::RequestViews { from, nonce }),
            (
                any::<u64>(),
                proptest::option::of(0..u64::MAX),
                any::<u8>(),
                any::<u64>()
            )
                .prop_map(|(view, primary_op, from, nonce)| Message::Views {
                    view,
                    primary_op,
                    from,
                    nonce
                }),
            (0u64..100, small, any::<u64>(), any::<u8>()).prop_map(|(op, state, view, from)| {
                Message::Snapshot {
                    checkpoint: Checkpoint::new(header(op, 1), state),
                    view,
                    from,
                }
            }),
        ]
    }

    proptest! {
        /// Every message comes back whole, and every cut of it is an error.
        #[test]
        fn messages_round_trip_and_every_cut_is_refused(message in message()) {
            let mut bytes = Vec::new();
            message.encode(&mut bytes);
            prop_assert_eq!(Message::decode(&bytes).unwrap(), message.clone());
            // The shared decoding gives the same message; a prepare's body is a slice
            // of the received buffer, not a copy.
            let wire = bytes::Bytes::from(bytes.clone());
            let shared = Message::decode_shared(&wire).unwrap();
            if let Message::Prepare(prepare) = &shared {
                if !prepare.body.is_empty() {
                    prop_assert!(wire.as_ptr_range().contains(&prepare.body.as_ptr()));
                }
            }
            prop_assert_eq!(shared, message);
            for cut in 0..bytes.len() {
                prop_assert!(Message::decode(&bytes[..cut]).is_err());
                let cut = wire.slice(..cut);
                prop_assert!(Message::decode_shared(&cut).is_err());
            }
            bytes.push(0);
            prop_assert!(Message::decode(&bytes).is_err(), "a trailing byte");
        }

        /// Bytes from a hostile peer decode or are refused; they never panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = Message::decode(&bytes);
            let _ = Reply::decode(&bytes);
        }

        /// Every reply comes back whole, and every cut of it is an error.
        #[test]
        fn replies_round_trip_and_every_cut_is_refused(
            (client, session, request, view) in (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
            register in any::<bool>(),
            result in prop_oneof![
                prop::collection::vec(any::<u8>(), 0..40).prop_map(Ok),
                Just(Err(Refusal::SessionUnknown)),
                Just(Err(Refusal::RequestTooOld)),
            ],
        ) {
            let reply = Reply { client, session, request, register, view, result };
            let mut bytes = Vec::new();
            reply.encode(&mut bytes);
            prop_assert_eq!(Reply::decode(&bytes).unwrap(), reply);
            for cut in 0..bytes.len() {
                prop_assert!(Reply::decode(&bytes[..cut]).is_err());
            }
            bytes.push(0);
            prop_assert!(Reply::decode(&bytes).is_err(), "a trailing byte");
        }
    }

    #[test]
    fn a_header_whose_checksum_fails_is_refused() {
        let mut bytes = Vec::new();
        Message::Prepare(Prepare {
            header: header(4, 1),
            body: bytes::Bytes::from_static(b"body"),
        })
        .encode(&mut bytes);
        bytes[10] ^= 1;
        assert!(matches!(
            Message::decode(&bytes),
            Err(DecodeError::Checksum { .. })
        ));
        // A count that cannot fit is refused before anything is allocated.
        let mut huge = vec![START_VIEW];
        huge.extend_from_slice(&[0; 24]);
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(Message::decode(&huge).is_err());
    }
}
