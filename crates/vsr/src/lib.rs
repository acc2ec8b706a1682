//! Viewstamped Replication as a sans-IO state machine.
//!
//! A [`Replica`] is one member of one consensus group. It owns no socket, clock or
//! disk: the shell feeds it [`Input`]s (messages, ticks, completions of the writes it
//! asked for) and carries out its [`Output`]s (messages to send, journal and state
//! writes, replies). The same code runs in the node and in the deterministic simulator
//! (`braid-sim`), which is how its safety is checked.
//!
//! The protocol follows "Viewstamped Replication Revisited" (Liskov and Cowling, 2012)
//! with the practices of TigerBeetle: prepares chained by their parent's checksum,
//! durable view state before view-scoped messages, view changes that carry log suffixes
//! and drop an op only on a quorum of nacks, repair of missing or damaged prepares by
//! checksum, state transfer for a replica behind every journal, and a client table in
//! the replicated state so a retried request is answered, never applied twice.

/// An invariant of the protocol: checked in debug builds and, with the `invariants`
/// feature (the simulator turns it on), in release builds too. A failure is a bug in
/// this crate, never a reaction to input, so it panics.
macro_rules! invariant {
    ($cond:expr, $($msg:tt)+) => {
        if cfg!(any(debug_assertions, feature = "invariants")) {
            assert!($cond, $($msg)+);
        }
    };
}

mod codec;
mod durable;
mod lazy;
mod message;
mod node;
pub mod op_map;
mod replica;
mod state;

pub use durable::{Checkpoint, DecodeError, DurableState};
pub use message::{
    checksum, Checksum, Header, Message, Operation, Prepare, Refusal, ReplicaId, Reply, Request,
    SuffixEntry,
};
pub use node::{Node, UnknownGroup};
pub use replica::{
    primary_of, Config, ConfigError, IgnoredCounts, Input, JournalSlot, Output, Persisted, Replica,
    StartError, Status, REPLICAS_MAX,
};
pub use state::{Applied, CounterMachine, ReplicatedState, StateMachine};
