//! Tracing one partition group's frames, to follow a seed's view changes message by
//! message (`BRAID_SHELL_SIM_TRACE_GROUP=P`).

use braid_vsr::{Message, SuffixEntry};

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
            Ok(Received::Message(_, message)) => describe(&message),
            Ok(other) => format!("{other:?}"),
            Err(err) => format!("undecodable: {err}"),
        };
        eprintln!("t{} {} -> {}: {what}", self.tick, packet.from, packet.to);
    }
}

/// A message as a line: a view change's log whole, one op a word (op, the first hex
/// digits of its checksum, `b` where its body came along), the rest cut short.
fn describe(message: &Message) -> String {
    let suffix = |entries: &[SuffixEntry]| -> String {
        let words: Vec<String> = entries
            .iter()
            .map(|e| {
                let body = if e.body.is_some() { "b" } else { "" };
                let sum = format!("{:032x}", e.header.checksum);
                format!("{}:{}v{}{body}", e.header.op, &sum[..4], e.header.view)
            })
            .collect();
        words.join(" ")
    };
    match message {
        Message::DoViewChange {
            view,
            log_view,
            op,
            commit,
            commit_checksum,
            suffix: entries,
            faulty,
            trusted_through,
            from,
        } => format!(
            "DoViewChange v{view} lv{log_view} op{op} c{commit} cc{} from {from} trusted \
             through {trusted_through} faulty {faulty:?} [{}]",
            commit_checksum.is_some(),
            suffix(entries)
        ),
        Message::StartView {
            view,
            op,
            commit,
            suffix: entries,
            from,
        } => format!(
            "StartView v{view} op{op} c{commit} from {from} [{}]",
            suffix(entries)
        ),
        other => format!("{other:?}").chars().take(TRACE_CHARS).collect(),
    }
}
