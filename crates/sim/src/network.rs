//! The simulated network: sending with loss, duplication and delay; delivery.

use braid_vsr::Input;

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
