//! Where a shard's frames to its peers go: the replica bus, nowhere (a lone node), or
//! a list the simulator carries over its own network.

use braid_bus::{Bus, Frame, ShardSender};

/// Where the frames to peers go.
#[derive(Debug, Default)]
pub(crate) enum Outbox {
    /// Nowhere: no bus is attached (a lone node, or before the bus is up).
    #[default]
    Nowhere,
    /// The replica bus, from a shard's own sender.
    Bus(ShardSender),
    /// The replica bus itself, from `shard`'s links: its holder keeps it running (the
    /// metadata group; dropping a [`Bus`] stops it).
    Owner { bus: Bus, shard: u16 },
    /// Kept for the caller to carry (the simulator's network).
    #[cfg(test)]
    Kept(Vec<(u8, Frame)>),
}

impl Outbox {
    /// Sends `frame` to `to`; a full or down link drops it (consensus retransmits).
    pub(crate) fn send(&mut self, to: u8, frame: Frame) {
        match self {
            Self::Nowhere => {}
            Self::Bus(bus) => {
                let _ = bus.send(to, frame);
            }
            Self::Owner { bus, shard } => {
                let _ = bus.send(*shard, to, frame);
            }
            #[cfg(test)]
            Self::Kept(kept) => kept.push((to, frame)),
        }
    }

    /// Whether frames go anywhere.
    pub(crate) fn is_nowhere(&self) -> bool {
        matches!(self, Self::Nowhere)
    }

    /// The frames kept since the last call (none unless [`Outbox::Kept`]).
    #[cfg(test)]
    pub(crate) fn take_kept(&mut self) -> Vec<(u8, Frame)> {
        match self {
            Self::Kept(kept) => std::mem::take(kept),
            _ => Vec::new(),
        }
    }
}
