//! Tracing one partition group's frames, to follow a seed's view changes message by
//! message (`BRAID_SHELL_SIM_TRACE_GROUP=P`).

use super::{Packet, Run};
use crate::replication::wire::{self, Received};

/// A traced message is cut to this many characters (a prepare's body is long).
const TRACE_CHARS: usize = 400;

impl Run {
    pub(super) fn trace_packet(&self, packet: &Packet) {
        if self.trace_group != Some(packet.frame.group) {
            return;
        }
        let what = match wire::received_from(packet.from, &packet.frame) {
            Ok(Received::Message(_, message)) => format!("{message:?}"),
            Ok(other) => format!("{other:?}"),
            Err(err) => format!("undecodable: {err}"),
        };
        let what: String = what.chars().take(TRACE_CHARS).collect();
        eprintln!("t{} {} -> {}: {what}", self.tick, packet.from, packet.to);
    }
}
