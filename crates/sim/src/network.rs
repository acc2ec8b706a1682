//! The simulated network: sending with loss, duplication and delay; delivery.

use braid_vsr::{Input, Message};

use super::*;

impl Simulation {
    pub(crate) fn send(&mut self, from: Address, to: Address, message: Payload) {
        let faults = if self.faults_on {
            self.config.faults
        } else {
            Faults::none()
        };
        if self.prng.chance(faults.loss_percent) {
            return;
        }
        let mut message = message;
        if self.prng.chance(faults.damage_percent) {
            let damaged = match &mut message {
                Payload::Replica(m) => damage(m, &mut self.prng),
                Payload::Reply(_) => false,
            };
            if !damaged {
                return; // no checksum of its own: the transport's frame CRC drops it
            }
            self.outcome.damaged_messages += 1;
        }
        let copies = if self.prng.chance(faults.duplicate_percent) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = 1 + self.prng.below(faults.delay_ticks_max.max(1));
            self.network.push(Packet {
                deliver_at: self.tick + delay,
                from,
                to,
                message: message.clone(),
            });
        }
    }

    pub(crate) fn reachable(&self, from: Address, to: Address) -> bool {
        match (from, to) {
            (Address::Replica(_, a), Address::Replica(_, b)) => !self.cut.contains(&(a, b)),
            _ => true,
        }
    }

    pub(crate) fn deliver(&mut self) {
        let tick = self.tick;
        let (due, later): (Vec<Packet>, Vec<Packet>) = std::mem::take(&mut self.network)
            .into_iter()
            .partition(|p| p.deliver_at <= tick);
        self.network = later;
        for packet in due {
            if !self.reachable(packet.from, packet.to) {
                continue;
            }
            const HISTORY_PACKETS: usize = 512;
            if self.history.len() == HISTORY_PACKETS {
                self.history.pop_front();
            }
            self.history.push_back(packet.clone());
            match (packet.to, packet.message) {
                (Address::Replica(group, replica), Payload::Replica(message)) => {
                    if self.trace {
                        eprintln!(
                            "t{tick} {:?} -> g{group}r{replica}: {}",
                            packet.from,
                            brief(&message)
                        );
                    }
                    self.input((group, replica), Input::Message(message));
                }
                (Address::Client(id), Payload::Reply(reply)) => self.on_reply(id, reply),
                _ => {}
            }
        }
    }
}

/// Alters checksummed content of a message in flight (a bit the frame CRC missed);
/// returns false for a message with no checksum of its own.
fn damage(message: &mut Message, prng: &mut Prng) -> bool {
    fn flip(bytes: &mut [u8], prng: &mut Prng) -> bool {
        if bytes.is_empty() {
            return false;
        }
        let at = prng.below(bytes.len() as u64) as usize;
        bytes[at] ^= 1 << prng.below(8);
        true
    }
    // A body is shared with its sender's journal: damage a copy of it in flight.
    fn flip_shared(body: &mut bytes::Bytes, prng: &mut Prng) -> bool {
        let mut copy = body.to_vec();
        let flipped = flip(&mut copy, prng);
        *body = copy.into();
        flipped
    }
    match message {
        Message::Prepare(prepare) => {
            if !flip_shared(&mut prepare.body, prng) {
                prepare.header.commit ^= 1;
            }
            true
        }
        Message::DoViewChange { suffix, .. } | Message::StartView { suffix, .. } => {
            let Some(entry) = suffix.last_mut() else {
                return false;
            };
            let flipped = entry
                .body
                .as_mut()
                .is_some_and(|body| flip_shared(body, prng));
            if !flipped {
                entry.header.request ^= 1;
            }
            true
        }
        Message::Snapshot { checkpoint, .. } => {
            if !flip(&mut checkpoint.state, prng) {
                checkpoint.header.view ^= 1;
            }
            true
        }
        _ => false,
    }
}
