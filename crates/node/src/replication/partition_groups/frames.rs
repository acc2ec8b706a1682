//! Frames from peers into a shard's partition groups: VSR messages in one turn per
//! burst (one write of the groups' durable states for all of them), a log copy's
//! fetches and chunks at once.

use braid_bus::Delivery;
use braid_vsr::Input;

use super::wire::{self, Received};
use super::{HostError, Moved, PartitionGroups};

impl PartitionGroups {
    /// Frames from peers, as many as came at once. Their VSR messages go to the groups
    /// in one turn, in the order they came, so the turn's durable states are written
    /// and synced once for all of them: a burst of elections in thousands of groups (a
    /// topic created, a member back) costs a few syncs instead of two per frame.
    pub(crate) fn deliver(&mut self, deliveries: &[Delivery]) -> Moved {
        let frames: Vec<(u8, &braid_bus::Frame)> =
            deliveries.iter().map(|d| (d.peer, &d.frame)).collect();
        self.deliver_frames(&frames)
    }

    /// A frame from a peer (the simulator's delivery, one frame a turn).
    #[cfg(test)]
    pub(crate) fn deliver_frame(&mut self, peer: u8, frame: &braid_bus::Frame) -> Moved {
        self.deliver_frames(&[(peer, frame)])
    }

    pub(super) fn deliver_frames(&mut self, frames: &[(u8, &braid_bus::Frame)]) -> Moved {
        let mut moved = Vec::new();
        let mut inputs = Vec::new();
        for (peer, frame) in frames {
            let (peer, frame) = (*peer, *frame);
            let received = wire::received_from(peer, frame);
            if let Ok(Received::Message(group, message)) = received {
                // A group this shard does not (yet) have: dropped, as the peer's
                // retries expect; never in the turn, which it would end.
                if self.host.replica(group).is_some() {
                    inputs.push((group, Input::Message(message)));
                }
                continue;
            }
            // Anything else acts at once: the messages before it go first.
            self.step_all(std::mem::take(&mut inputs), &mut moved);
            match received {
                Ok(Received::Message(..)) => {}
                Ok(Received::Reply(group, _)) => {
                    tracing::debug!(group, "a reply for a partition group: its primary is local");
                }
                Ok(Received::LogFetch {
                    group,
                    from,
                    to,
                    anchor,
                }) => {
                    self.serve_copy(peer, group, from, to, anchor);
                }
                Ok(Received::LogChunk {
                    group,
                    from,
                    start,
                    batches,
                }) => self.take_copy(group, from, start, &batches, &mut moved),
                Err(err) => {
                    tracing::warn!(peer, %err, "a replica frame that does not decode");
                }
            }
        }
        self.step_all(inputs, &mut moved);
        // An answer (a register's, say) may have let queued produces go.
        self.flush_into(&mut moved);
        moved
    }

    /// One turn of `inputs` (each for a group the host has), if there are any.
    pub(super) fn step_all(&mut self, inputs: Vec<(u64, Input)>, moved: &mut Moved) {
        if inputs.is_empty() || self.failed.is_some() {
            return;
        }
        match self.host.step(self.now, inputs) {
            Ok(effects) => self.carry(effects, moved),
            Err(HostError::UnknownGroup(_)) => {}
            Err(err) => self.fail(err),
        }
    }
}
