//! The replica bus between Braid nodes: the pure parts.
//!
//! Nodes of a cluster talk over k TCP links per peer. This crate holds the logic as
//! sans-IO pieces that the node's IO shell drives:
//! - [`placement`]: which link a shard sends over and which shard owns each link;
//! - [`handshake`]: the 8-byte preamble and the authenticated hello, as typestates
//!   under one admission deadline;
//! - [`bundle`]: the k links to a peer as one bundle that is whole or torn down;
//! - [`frame`]: the checksummed frames links carry.
//!
//! The IO shell (sockets with TCP_NODELAY and TCP_USER_TIMEOUT, optional TLS, bounded
//! per-link queues, metrics) is the next step.

pub mod bundle;
pub mod frame;
pub mod handshake;
pub mod placement;

pub use bundle::{Backoff, Bundle, BundleAction, LinkRefused};
pub use frame::{Frame, FrameError, FRAME_HEADER_BYTES};
pub use handshake::{
    accept_preamble, DialerAwaitReply, Established, HandshakeConfig, Preamble, Refusal,
};
pub use placement::{LayoutError, LinkLayout, INBOUND_HANDSHAKES_MAX, METADATA_LINK};
