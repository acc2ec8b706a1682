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
//! [`io`] is the tokio shell around them: sockets with TCP_NODELAY and
//! TCP_USER_TIMEOUT, dialing and accepting under one admission deadline, a task pair per
//! link, bounded per-link queues that drop (and count) rather than block, and metrics.
//! Optional mutual TLS (rustls) wraps each link after the preamble. Given one runtime
//! per shard ([`Bus::start_on_shards`]), each link runs on its owner shard and the
//! acceptor hands the socket over right after the preamble.

pub mod bundle;
pub mod frame;
pub mod handshake;
pub mod io;
pub mod placement;
#[cfg(test)]
mod test_certificates;

pub use bundle::{Backoff, Bundle, BundleAction, LinkRefused};
pub use frame::{Frame, FrameError, FRAME_HEADER_BYTES, ZERO_COPY_PAYLOAD_BYTES_MIN};
pub use handshake::{
    accept_preamble, pair_key, DialerAwaitReply, Established, HandshakeConfig, LinkKeys, Preamble,
    Refusal,
};
pub use io::{
    BundleEvent, Bus, BusConfig, BusMetrics, BusView, Delivery, DeliveryRoute, PeerStatus,
    SendError, ShardSender, StartError, TlsConfig, DELIVERY_OVERHEAD_BYTES,
};
pub use placement::{LayoutError, LinkLayout, INBOUND_HANDSHAKES_MAX, METADATA_LINK};
