//! Braid's wire and storage formats.
//!
//! This crate is the bottom of the dependency graph: pure codecs, no IO. Every decoder
//! takes bytes that came from a socket or a disk and returns a `Result`; none panics on
//! any input (each has a fuzz target under `fuzz/`).
//!
//! - [`batch`]: the record batch (Kafka message format v2), the unit Braid appends,
//!   replicates and serves.
//! - [`client`]: the native client protocol's frames, requests and responses.
//! - [`wire`]: the field encoding of those frames.
//! - [`hash`]: where a key lands on the 16-bit hash ring.
//! - [`scram`]: SCRAM-SHA-256, the client authentication, as pure state machines.
//! - [`varint`]: the zig-zag varints the records use.

pub mod batch;
pub mod client;
pub mod hash;
pub mod scram;
pub mod varint;
pub mod wire;

pub use batch::{BatchBuilder, BatchError, BatchHeader, RecordBatch, ValidatedBatch};
