//! Where a shard's frames to its peers go.

use braid_bus::ShardSender;

/// Where the shard's frames to peers go.
#[derive(Debug, Default)]
pub(super) enum Outbox {
    /// Nowhere: no bus is attached (a lone node, or before the bus is up).
    #[default]
    Nowhere,
    /// The replica bus.
    Bus(ShardSender),
    /// Kept for the caller to carry (the simulator's network).
    #[cfg(test)]
    Kept(Vec<(u8, braid_bus::Frame)>),
}

impl Outbox {
    /// Sends `frame` to `to`; a full or down link drops it (consensus retransmits).
    pub(super) fn send(&mut self, to: u8, frame: braid_bus::Frame) {
        match self {
            Self::Nowhere => {}
            Self::Bus(bus) => {
                let _ = bus.send(to, frame);
            }
            #[cfg(test)]
            Self::Kept(kept) => kept.push((to, frame)),
        }
    }
}
