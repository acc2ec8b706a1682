//! VSR traffic on the replica bus: one frame per message, the frame's group the
//! consensus group. A [`KIND_VSR`] frame carries a message between replicas (or a
//! node's request to a primary); a [`KIND_REPLY`] frame carries a primary's answer to a
//! request another node sent.

use braid_bus::{Delivery, Frame};
use braid_vsr::{DecodeError, Message, Reply};

/// The frame kind of a VSR message.
pub(crate) const KIND_VSR: u8 = 1;
/// The frame kind of a reply to a node's request.
pub(crate) const KIND_REPLY: u8 = 2;

/// What a delivered frame carries.
#[derive(Debug)]
pub(crate) enum Received {
    /// A message for a replica of the group.
    Message(u64, Message),
    /// A reply for this node's client of the group.
    Reply(u64, Reply),
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
}

/// The frame that carries `message` of `group`.
pub(crate) fn frame(group: u64, message: &Message) -> Frame {
    let mut payload = Vec::new();
    message.encode(&mut payload);
    Frame::new(group, KIND_VSR, payload)
}

/// The frame that carries `reply` of `group`.
pub(crate) fn reply_frame(group: u64, reply: &Reply) -> Frame {
    let mut payload = Vec::new();
    reply.encode(&mut payload);
    Frame::new(group, KIND_REPLY, payload)
}

/// What a delivery carries: a message or a reply.
pub(crate) fn received(delivery: &Delivery) -> Result<Received, WireError> {
    if delivery.frame.kind == KIND_REPLY {
        let reply = Reply::decode(&delivery.frame.payload)?;
        return Ok(Received::Reply(delivery.frame.group, reply));
    }
    let (group, message) = message(delivery)?;
    Ok(Received::Message(group, message))
}

/// The group and message a delivery carries. A replica message must come from the
/// peer it names: the bus authenticated the peer, not the bytes' claim.
pub(crate) fn message(delivery: &Delivery) -> Result<(u64, Message), WireError> {
    let frame = &delivery.frame;
    if frame.kind != KIND_VSR {
        return Err(WireError::Kind(frame.kind));
    }
    let message = Message::decode(&frame.payload)?;
    if let Some(claimed) = message.from() {
        if claimed != delivery.peer {
            return Err(WireError::Impostor {
                claimed,
                peer: delivery.peer,
            });
        }
    }
    Ok((frame.group, message))
}
