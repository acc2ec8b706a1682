//! VSR traffic on the replica bus: one frame per message, the frame's group the
//! consensus group. A [`KIND_VSR`] frame carries a message between replicas (or a
//! node's request to a primary); a [`KIND_REPLY`] frame carries a primary's answer to a
//! request another node sent; [`KIND_LOG_FETCH`] and [`KIND_LOG_CHUNK`] copy a
//! partition's log to a replica that installed a checkpoint beyond it (state
//! transfer).

use braid_bus::Frame;
use braid_vsr::{Checksum, DecodeError, Message, Reply};

/// The frame kind of a VSR message.
pub(crate) const KIND_VSR: u8 = 1;
/// The frame kind of a reply to a node's request.
pub(crate) const KIND_REPLY: u8 = 2;
/// The frame kind of a request for a partition log's committed batches:
/// `from: u64, to: u64`, then, for a copy up to a checkpoint, the checkpoint's
/// `op: u64, checksum: u128` (a peer whose journal holds that op with that checksum
/// holds the committed log up to its batch, whatever its own commit says).
pub(crate) const KIND_LOG_FETCH: u8 = 3;
/// The frame kind of the answer: `from: u64, start: u64` (the sender's log start),
/// then whole batches from `from`, as stored.
pub(crate) const KIND_LOG_CHUNK: u8 = 4;

/// What a delivered frame carries.
#[derive(Debug)]
pub(crate) enum Received {
    /// A message for a replica of the group.
    Message(u64, Message),
    /// A reply for this node's client of the group.
    Reply(u64, Reply),
    /// A peer asks for the group's committed batches in `[from, to)`, for a copy up
    /// to the checkpoint at `anchor` (its op and checksum) if it names one.
    LogFetch {
        group: u64,
        from: u64,
        to: u64,
        anchor: Option<(u64, Checksum)>,
    },
    /// Batches of the group's log from `from`, whole; `start` is where the sender's
    /// log begins now.
    LogChunk {
        group: u64,
        from: u64,
        start: u64,
        batches: bytes::Bytes,
    },
}

/// Why a delivered frame is not a VSR message.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WireError {
    #[error("frame kind {0} is not a VSR message")]
    Kind(u8),
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error("message claims to be from replica {claimed} but came from peer {peer}")]
    Impostor { claimed: u8, peer: u8 },
    #[error("a log-copy frame of {0} bytes is too short")]
    ShortCopy(usize),
}

/// The frame that carries `message` of `group`.
pub(crate) fn frame(group: u64, message: &Message) -> Frame {
    // Sized for the body up front: a megabyte batch is copied once, not regrown.
    let body = match message {
        Message::Prepare(prepare) => prepare.body.len(),
        Message::Request(request) => request.body.len(),
        _ => 0,
    };
    let mut payload = Vec::with_capacity(body + braid_vsr::Header::ENCODED_BYTES + 64);
    message.encode(&mut payload);
    Frame::new(group, KIND_VSR, payload)
}

/// Frames outgoing messages; a prepare sent to several backups in a row is encoded
/// once, its frame (one shared buffer) handed to each.
#[derive(Debug, Default)]
pub(crate) struct Framer {
    last_prepare: Option<(u64, braid_vsr::Checksum, Frame)>,
}

impl Framer {
    /// The frame that carries `message` of `group`.
    pub(crate) fn frame(&mut self, group: u64, message: &Message) -> Frame {
        let Message::Prepare(prepare) = message else {
            return frame(group, message);
        };
        let checksum = prepare.header.checksum;
        if let Some((g, c, frame)) = &self.last_prepare {
            if *g == group && *c == checksum {
                return frame.clone();
            }
        }
        let encoded = frame(group, message);
        self.last_prepare = Some((group, checksum, encoded.clone()));
        encoded
    }
}

/// The frame that carries `reply` of `group`.
pub(crate) fn reply_frame(group: u64, reply: &Reply) -> Frame {
    let mut payload = Vec::new();
    reply.encode(&mut payload);
    Frame::new(group, KIND_REPLY, payload)
}

/// The frame asking for `group`'s committed batches in `[from, to)`, for a copy up to
/// the checkpoint `anchor` names, if any.
pub(crate) fn log_fetch_frame(
    group: u64,
    from: u64,
    to: u64,
    anchor: Option<(u64, Checksum)>,
) -> Frame {
    let mut payload = Vec::with_capacity(40);
    payload.extend_from_slice(&from.to_be_bytes());
    payload.extend_from_slice(&to.to_be_bytes());
    if let Some((op, checksum)) = anchor {
        payload.extend_from_slice(&op.to_be_bytes());
        payload.extend_from_slice(&checksum.to_be_bytes());
    }
    Frame::new(group, KIND_LOG_FETCH, payload)
}

/// The frame answering a log fetch at `from` with `batches`.
pub(crate) fn log_chunk_frame(group: u64, from: u64, start: u64, batches: &[u8]) -> Frame {
    let mut payload = Vec::with_capacity(16 + batches.len());
    payload.extend_from_slice(&from.to_be_bytes());
    payload.extend_from_slice(&start.to_be_bytes());
    payload.extend_from_slice(batches);
    Frame::new(group, KIND_LOG_CHUNK, payload)
}

/// The two words a log-copy frame starts with.
fn two_words(payload: &[u8]) -> Result<(u64, u64), WireError> {
    let word = |at: usize| -> Option<u64> {
        Some(u64::from_be_bytes(
            payload.get(at..at + 8)?.try_into().ok()?,
        ))
    };
    match (word(0), word(8)) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(WireError::ShortCopy(payload.len())),
    }
}

/// What `frame`, from `peer` (as the bus authenticated it), carries.
pub(crate) fn received_from(peer: u8, frame: &Frame) -> Result<Received, WireError> {
    match frame.kind {
        KIND_REPLY => {
            let reply = Reply::decode(&frame.payload)?;
            return Ok(Received::Reply(frame.group, reply));
        }
        KIND_LOG_FETCH => {
            let (from, to) = two_words(&frame.payload)?;
            let anchor = match frame.payload.get(16..) {
                Some([]) => None,
                Some(rest) if rest.len() == 24 => {
                    let (op, checksum) = rest.split_at(8);
                    let op = u64::from_be_bytes(
                        op.try_into()
                            .map_err(|_| WireError::ShortCopy(frame.payload.len()))?,
                    );
                    let checksum = u128::from_be_bytes(
                        checksum
                            .try_into()
                            .map_err(|_| WireError::ShortCopy(frame.payload.len()))?,
                    );
                    Some((op, checksum))
                }
                _ => return Err(WireError::ShortCopy(frame.payload.len())),
            };
            return Ok(Received::LogFetch {
                group: frame.group,
                from,
                to,
                anchor,
            });
        }
        KIND_LOG_CHUNK => {
            let (from, start) = two_words(&frame.payload)?;
            return Ok(Received::LogChunk {
                group: frame.group,
                from,
                start,
                batches: frame.payload.slice(16..),
            });
        }
        _ => {}
    }
    let (group, message) = message_from(peer, frame)?;
    Ok(Received::Message(group, message))
}

/// The group and message a delivery carries. A replica message must come from the
/// peer it names: the bus authenticated the peer, not the bytes' claim.
#[cfg(test)]
pub(crate) fn message(delivery: &braid_bus::Delivery) -> Result<(u64, Message), WireError> {
    message_from(delivery.peer, &delivery.frame)
}

fn message_from(peer: u8, frame: &Frame) -> Result<(u64, Message), WireError> {
    if frame.kind != KIND_VSR {
        return Err(WireError::Kind(frame.kind));
    }
    let message = Message::decode_shared(&frame.payload)?;
    if let Some(claimed) = message.from() {
        if claimed != peer {
            return Err(WireError::Impostor { claimed, peer });
        }
    }
    Ok((frame.group, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_vsr::{Header, Prepare};

    fn prepare(op: u64, body: &'static [u8]) -> Message {
        let header = Header {
            op,
            body_checksum: braid_vsr::checksum(body),
            ..Header::root(7)
        }
        .seal();
        Message::Prepare(Prepare {
            header,
            body: bytes::Bytes::from_static(body),
        })
    }

    #[test]
    fn a_prepare_for_several_backups_is_encoded_once_and_shared() {
        let mut framer = Framer::default();
        let first = framer.frame(7, &prepare(1, b"batch"));
        let again = framer.frame(7, &prepare(1, b"batch"));
        assert_eq!(first.payload.as_ptr(), again.payload.as_ptr(), "one buffer");
        let next = framer.frame(7, &prepare(2, b"other"));
        assert_ne!(next.payload.as_ptr(), first.payload.as_ptr());
        // The same prepare for another group is that group's own frame.
        let elsewhere = framer.frame(8, &prepare(2, b"other"));
        assert_eq!(elsewhere.group, 8);
        assert_ne!(elsewhere.payload.as_ptr(), next.payload.as_ptr());
        // What the peer decodes is the message sent.
        assert_eq!(
            Message::decode_shared(&again.payload).unwrap(),
            prepare(1, b"batch")
        );
    }

    /// A log fetch names the checkpoint its copy goes to, or nothing (a repair); any
    /// other length is refused, typed.
    #[test]
    fn a_log_fetch_carries_its_checkpoint_or_none_and_nothing_else() {
        for anchor in [None, Some((447, u128::MAX - 5))] {
            let frame = log_fetch_frame(9, 131, 1_116, anchor);
            match received_from(1, &frame).unwrap() {
                Received::LogFetch {
                    group,
                    from,
                    to,
                    anchor: got,
                } => assert_eq!((group, from, to, got), (9, 131, 1_116, anchor)),
                other => panic!("{other:?}"),
            }
        }
        let mut frame = log_fetch_frame(9, 131, 1_116, Some((447, 1)));
        for len in [0, 8, 17, 39] {
            frame.payload = frame.payload.slice(..len.min(frame.payload.len()));
            assert!(received_from(1, &frame).is_err(), "{len} bytes");
            frame = log_fetch_frame(9, 131, 1_116, Some((447, 1)));
        }
    }
}
