//! VSR messages on the replica bus: one frame per message, of kind [`KIND_VSR`], the
//! frame's group the consensus group, the payload the message's wire form.

// The replication host sends through this once it runs; until then only the tests do.
#![cfg_attr(not(test), allow(dead_code))]

use braid_bus::{Delivery, Frame};
use braid_vsr::{DecodeError, Message};

/// The frame kind of a VSR message.
pub(crate) const KIND_VSR: u8 = 1;

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
