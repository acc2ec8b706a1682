//! The link handshake as typestates: each step consumes the previous state, so a link
//! cannot be admitted without passing every check.
//!
//! On a new TCP connection the dialer sends the 8-byte [`Preamble`]; shard 0 of the
//! acceptor reads exactly those bytes and hands the socket to the owner shard of that
//! link, which runs the rest (after TLS, when on):
//!
//! 1. dialer -> acceptor: `Hello` (cluster, replica, k, link, generation, capabilities,
//!    dialer nonce, incarnation);
//! 2. acceptor -> dialer: `HelloReply` (its own fields and nonce, and a MAC over both
//!    hellos);
//! 3. dialer -> acceptor: `Confirm` (the dialer's MAC over both hellos).
//!
//! With keys ([`LinkKeys`]), the MACs (HMAC-SHA256) cover every field and both nonces,
//! so neither side admits a peer that does not know the key, and a recorded handshake
//! cannot be replayed. With a key per pair of members, a member holds only its own
//! pairs' keys, so it can prove no id but its own: a hello's replica id is what the
//! key proves, not what the dialer claims. One admission deadline, set when the socket was accepted, covers
//! the preamble read and every step.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of the preamble.
pub const PREAMBLE_BYTES: usize = 8;
/// Bytes of a hello.
pub const HELLO_BYTES: usize = 44;
/// Bytes of a MAC.
pub const MAC_BYTES: usize = 32;
/// Bytes of a hello reply.
pub const REPLY_BYTES: usize = HELLO_BYTES + MAC_BYTES;
/// Bytes of a confirm.
pub const CONFIRM_BYTES: usize = 1 + MAC_BYTES;
/// Capability bit: the node understands light pub/sub frames.
pub const CAPABILITY_LIGHT_FRAMES: u32 = 1;

const MAGIC: [u8; 2] = *b"BR";
const VERSION: u8 = 2;
const KIND_HELLO: u8 = 1;
const KIND_REPLY: u8 = 2;
const KIND_CONFIRM: u8 = 3;

/// Why a link was refused. Every refusal closes the socket and changes no bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The preamble's magic is wrong (not a Braid replica).
    #[error("bad preamble magic")]
    BadMagic,
    /// The preamble's version is not supported.
    #[error("unsupported bus version {0}")]
    Version(u8),
    /// The preamble names a replica that is not a peer.
    #[error("unknown replica {0}")]
    UnknownReplica(u8),
    /// The preamble names a link beyond k.
    #[error("link {link} of {links}")]
    NoSuchLink {
        /// The link.
        link: u16,
        /// k.
        links: u16,
    },
    /// A message is malformed.
    #[error("malformed handshake message")]
    Malformed,
    /// The peer belongs to another cluster.
    #[error("cluster id {theirs:#x} is not ours ({ours:#x})")]
    Cluster {
        /// Ours.
        ours: u64,
        /// Theirs.
        theirs: u64,
    },
    /// The hello disagrees with the preamble.
    #[error("hello disagrees with the preamble")]
    PreambleMismatch,
    /// The peer uses another k.
    #[error("peer has {theirs} links per peer, we have {ours}")]
    LinkCount {
        /// Ours.
        ours: u16,
        /// Theirs.
        theirs: u16,
    },
    /// The MAC does not verify: wrong cluster secret or tampering.
    #[error("handshake MAC does not verify")]
    BadMac,
    /// The link's bundle generation is older than the current one.
    #[error("stale bundle generation {theirs} (current {current})")]
    StaleGeneration {
        /// The link's.
        theirs: u32,
        /// The current.
        current: u32,
    },
    /// The admission deadline passed.
    #[error("handshake not finished within the admission deadline")]
    Timeout,
    /// A replica with a higher id dialed: the lower id of a pair dials, so accepting
    /// would let either side take over the other's bundle.
    #[error("replica {dialer} dialed replica {acceptor}: the lower id dials")]
    WrongDialer {
        /// The dialer's id.
        dialer: u8,
        /// Ours.
        acceptor: u8,
    },
}

/// The generation bits the preamble carries; the hello carries all 32 under the MAC.
pub const PREAMBLE_GENERATION_MASK: u32 = 0x00FF_FFFF;

/// The 8 bytes a dialer sends first: magic, version, its replica id, the link index and
/// the bundle generation (24 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preamble {
    /// The dialer's replica id.
    pub replica: u8,
    /// The link index.
    pub link: u8,
    /// The bundle generation, so a link of an older bundle never joins a newer one.
    pub generation: u32,
}

impl Preamble {
    /// The wire form.
    pub fn encode(&self) -> [u8; PREAMBLE_BYTES] {
        let g = self.generation.to_be_bytes();
        [
            MAGIC[0],
            MAGIC[1],
            VERSION,
            self.replica,
            self.link,
            g[1],
            g[2],
            g[3],
        ]
    }

    /// Reads a preamble.
    ///
    /// # Errors
    /// [`Refusal::BadMagic`], [`Refusal::Version`].
    pub fn decode(bytes: &[u8; PREAMBLE_BYTES]) -> Result<Self, Refusal> {
        if bytes[..2] != MAGIC {
            return Err(Refusal::BadMagic);
        }
        if bytes[2] != VERSION {
            return Err(Refusal::Version(bytes[2]));
        }
        Ok(Self {
            replica: bytes[3],
            link: bytes[4],
            generation: u32::from_be_bytes([0, bytes[5], bytes[6], bytes[7]]),
        })
    }
}

/// What a node says about itself in a hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The cluster id.
    pub cluster: u64,
    /// The sender's replica id.
    pub replica: u8,
    /// Links per peer (k).
    pub links: u8,
    /// The link index.
    pub link: u8,
    /// The bundle generation.
    pub generation: u32,
    /// Capability bits.
    pub capabilities: u32,
    /// A fresh random nonce.
    pub nonce: [u8; 16],
    /// The sender's incarnation: random per process start, so the acceptor knows a
    /// restarted dialer and starts it a fresh bundle instead of refusing its low
    /// generations (covered by the MAC like every field).
    pub incarnation: u64,
}

impl Hello {
    fn encode(&self, kind: u8) -> [u8; HELLO_BYTES] {
        let mut out = [0u8; HELLO_BYTES];
        out[0] = kind;
        out[1..9].copy_from_slice(&self.cluster.to_be_bytes());
        out[9] = self.replica;
        out[10] = self.links;
        out[11] = self.link;
        out[12..16].copy_from_slice(&self.generation.to_be_bytes());
        out[16..20].copy_from_slice(&self.capabilities.to_be_bytes());
        out[20..36].copy_from_slice(&self.nonce);
        out[36..44].copy_from_slice(&self.incarnation.to_be_bytes());
        out
    }

    fn decode(bytes: &[u8], kind: u8) -> Result<Self, Refusal> {
        if bytes.len() < HELLO_BYTES || bytes[0] != kind {
            return Err(Refusal::Malformed);
        }
        let word = |at: usize| {
            u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let mut cluster = [0u8; 8];
        cluster.copy_from_slice(&bytes[1..9]);
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(&bytes[20..36]);
        let mut incarnation = [0u8; 8];
        incarnation.copy_from_slice(&bytes[36..44]);
        Ok(Self {
            incarnation: u64::from_be_bytes(incarnation),
            cluster: u64::from_be_bytes(cluster),
            replica: bytes[9],
            links: bytes[10],
            link: bytes[11],
            generation: word(12),
            capabilities: word(16),
            nonce,
        })
    }
}

/// A node's side of handshakes.
#[derive(Debug, Clone)]
pub struct HandshakeConfig {
    /// The cluster id.
    pub cluster: u64,
    /// This replica.
    pub replica: u8,
    /// Replicas in the cluster.
    pub replica_count: u8,
    /// Links per peer (k).
    pub links: u16,
    /// Capability bits this node offers.
    pub capabilities: u32,
    /// What the handshake's MACs are keyed with.
    pub keys: LinkKeys,
    /// This process's incarnation (random per start).
    pub incarnation: u64,
}

/// The keys of a member's links.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum LinkKeys {
    /// No MAC: any peer that reaches the port is admitted (tests, trusted networks).
    #[default]
    Off,
    /// One cluster secret for every pair: a holder can pose as any member.
    Shared(Vec<u8>),
    /// A key per peer, the one its pair shares: a member holds only its own pairs'
    /// keys, so it can prove only its own id. A peer without a key is refused.
    PerPeer(std::collections::BTreeMap<u8, Vec<u8>>),
}

impl std::fmt::Debug for LinkKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys themselves.
        match self {
            Self::Off => f.write_str("Off"),
            Self::Shared(_) => f.write_str("Shared(..)"),
            Self::PerPeer(keys) => write!(f, "PerPeer(peers {:?})", keys.keys()),
        }
    }
}

/// The key members `a` and `b` of cluster `cluster` share, derived from the operator's
/// master secret (HMAC-SHA256). The operator derives each member's keys and gives it
/// only those; the master stays off the members.
pub fn pair_key(master: &[u8], cluster: &str, a: u8, b: u8) -> [u8; MAC_BYTES] {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(master) else {
        return [0; MAC_BYTES];
    };
    mac.update(b"braid member pair v1\0");
    mac.update(cluster.as_bytes());
    mac.update(&[0, a.min(b), a.max(b)]);
    mac.finalize().into_bytes().into()
}

impl LinkKeys {
    /// The key of the link with `peer`: `None` when MACs are off.
    ///
    /// # Errors
    /// [`Refusal::BadMac`] for a peer this member holds no key for.
    fn for_peer(&self, peer: u8) -> Result<Option<&[u8]>, Refusal> {
        match self {
            Self::Off => Ok(None),
            Self::Shared(secret) => Ok(Some(secret)),
            Self::PerPeer(keys) => keys
                .get(&peer)
                .map(|k| Some(k.as_slice()))
                .ok_or(Refusal::BadMac),
        }
    }
}

/// A link both sides admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Established {
    /// The peer.
    pub peer: u8,
    /// The link index.
    pub link: u16,
    /// The bundle generation.
    pub generation: u32,
    /// Capabilities both sides offer.
    pub capabilities: u32,
    /// The peer's incarnation.
    pub peer_incarnation: u64,
}

fn mac(secret: Option<&[u8]>, label: &[u8], hello: &[u8], reply: &[u8]) -> [u8; MAC_BYTES] {
    let Some(secret) = secret else {
        return [0; MAC_BYTES];
    };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        return [0; MAC_BYTES];
    };
    mac.update(label);
    mac.update(hello);
    mac.update(reply);
    mac.finalize().into_bytes().into()
}

fn verify(
    secret: Option<&[u8]>,
    label: &[u8],
    hello: &[u8],
    reply: &[u8],
    tag: &[u8],
) -> Result<(), Refusal> {
    let Some(key) = secret else {
        return Ok(());
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(key).map_err(|_| Refusal::BadMac)?;
    mac.update(label);
    mac.update(hello);
    mac.update(reply);
    // Constant-time comparison.
    mac.verify_slice(tag).map_err(|_| Refusal::BadMac)
}

const LABEL_ACCEPT: &[u8] = b"braid-bus accept v1";
const LABEL_DIAL: &[u8] = b"braid-bus dial v1";

/// The dialer, after sending preamble and hello, waiting for the reply.
#[derive(Debug)]
pub struct DialerAwaitReply {
    config: HandshakeConfig,
    hello: [u8; HELLO_BYTES],
    peer: u8,
    link: u16,
    generation: u32,
}

impl DialerAwaitReply {
    /// Starts dialing link `link` of bundle `generation` to `peer`; returns the state
    /// and the bytes to send (preamble then hello).
    pub fn start(
        config: HandshakeConfig,
        peer: u8,
        link: u16,
        generation: u32,
        nonce: [u8; 16],
    ) -> (Self, Vec<u8>) {
        let preamble = Preamble {
            replica: config.replica,
            link: link as u8,
            generation,
        };
        let hello = Hello {
            cluster: config.cluster,
            replica: config.replica,
            links: config.links as u8,
            link: link as u8,
            generation,
            capabilities: config.capabilities,
            nonce,
            incarnation: config.incarnation,
        }
        .encode(KIND_HELLO);
        let mut bytes = preamble.encode().to_vec();
        bytes.extend_from_slice(&hello);
        let state = Self {
            config,
            hello,
            peer,
            link,
            generation,
        };
        (state, bytes)
    }

    /// Takes the acceptor's reply; returns the established link and the confirm to send.
    ///
    /// # Errors
    /// A [`Refusal`]: the link must be closed.
    pub fn on_reply(self, reply: &[u8]) -> Result<(Established, [u8; CONFIRM_BYTES]), Refusal> {
        if reply.len() != REPLY_BYTES {
            return Err(Refusal::Malformed);
        }
        let (fields, tag) = reply.split_at(HELLO_BYTES);
        let theirs = Hello::decode(fields, KIND_REPLY)?;
        if theirs.cluster != self.config.cluster {
            return Err(Refusal::Cluster {
                ours: self.config.cluster,
                theirs: theirs.cluster,
            });
        }
        if theirs.replica != self.peer
            || theirs.link as u16 != self.link
            || theirs.generation != self.generation
        {
            return Err(Refusal::PreambleMismatch);
        }
        if u16::from(theirs.links) != self.config.links {
            return Err(Refusal::LinkCount {
                ours: self.config.links,
                theirs: theirs.links.into(),
            });
        }
        let key = self.config.keys.for_peer(self.peer)?;
        verify(key, LABEL_ACCEPT, &self.hello, fields, tag)?;
        let mut confirm = [0u8; CONFIRM_BYTES];
        confirm[0] = KIND_CONFIRM;
        confirm[1..].copy_from_slice(&mac(key, LABEL_DIAL, &self.hello, fields));
        let established = Established {
            peer: self.peer,
            link: self.link,
            generation: self.generation,
            capabilities: self.config.capabilities & theirs.capabilities,
            peer_incarnation: theirs.incarnation,
        };
        Ok((established, confirm))
    }
}

/// The acceptor, with the socket handed to the link's owner: waiting for the hello.
#[derive(Debug)]
pub struct AcceptorAwaitHello {
    config: HandshakeConfig,
    preamble: Preamble,
    deadline: u64,
}

/// Reads a preamble on shard 0: which link owner gets the socket.
///
/// # Errors
/// [`Refusal`] for a bad magic or version, an unknown replica, a link beyond k, or a
/// passed deadline.
pub fn accept_preamble(
    config: HandshakeConfig,
    bytes: &[u8; PREAMBLE_BYTES],
    now: u64,
    deadline: u64,
) -> Result<AcceptorAwaitHello, Refusal> {
    if now > deadline {
        return Err(Refusal::Timeout);
    }
    let preamble = Preamble::decode(bytes)?;
    if preamble.replica >= config.replica_count || preamble.replica == config.replica {
        return Err(Refusal::UnknownReplica(preamble.replica));
    }
    if preamble.replica > config.replica {
        return Err(Refusal::WrongDialer {
            dialer: preamble.replica,
            acceptor: config.replica,
        });
    }
    if u16::from(preamble.link) >= config.links {
        return Err(Refusal::NoSuchLink {
            link: preamble.link.into(),
            links: config.links,
        });
    }
    Ok(AcceptorAwaitHello {
        config,
        preamble,
        deadline,
    })
}

impl AcceptorAwaitHello {
    /// The preamble read.
    pub fn preamble(&self) -> &Preamble {
        &self.preamble
    }

    /// Takes the dialer's hello; returns the next state and the reply to send.
    ///
    /// # Errors
    /// A [`Refusal`]: the link must be closed.
    pub fn on_hello(
        self,
        bytes: &[u8],
        nonce: [u8; 16],
        now: u64,
    ) -> Result<(AcceptorAwaitConfirm, [u8; REPLY_BYTES]), Refusal> {
        if now > self.deadline {
            return Err(Refusal::Timeout);
        }
        if bytes.len() != HELLO_BYTES {
            return Err(Refusal::Malformed);
        }
        let hello = Hello::decode(bytes, KIND_HELLO)?;
        if hello.cluster != self.config.cluster {
            return Err(Refusal::Cluster {
                ours: self.config.cluster,
                theirs: hello.cluster,
            });
        }
        let p = self.preamble;
        // The preamble has the low 24 bits of the generation; the hello has all 32.
        if hello.replica != p.replica
            || hello.link != p.link
            || hello.generation & PREAMBLE_GENERATION_MASK != p.generation
        {
            return Err(Refusal::PreambleMismatch);
        }
        let p = Preamble {
            generation: hello.generation,
            ..p
        };
        if u16::from(hello.links) != self.config.links {
            return Err(Refusal::LinkCount {
                ours: self.config.links,
                theirs: hello.links.into(),
            });
        }
        let ours = Hello {
            cluster: self.config.cluster,
            replica: self.config.replica,
            links: self.config.links as u8,
            link: p.link,
            generation: p.generation,
            capabilities: self.config.capabilities,
            nonce,
            incarnation: self.config.incarnation,
        }
        .encode(KIND_REPLY);
        let mut reply = [0u8; REPLY_BYTES];
        reply[..HELLO_BYTES].copy_from_slice(&ours);
        // Keyed by the id the hello claims: only that member (or this one) holds the
        // key, so a dialer that claims another's id cannot confirm.
        let key = self.config.keys.for_peer(p.replica)?.map(<[u8]>::to_vec);
        reply[HELLO_BYTES..].copy_from_slice(&mac(key.as_deref(), LABEL_ACCEPT, bytes, &ours));
        let mut hello_bytes = [0u8; HELLO_BYTES];
        hello_bytes.copy_from_slice(bytes);
        let next = AcceptorAwaitConfirm {
            key,
            hello: hello_bytes,
            reply: ours,
            established: Established {
                peer: p.replica,
                link: p.link.into(),
                generation: p.generation,
                capabilities: self.config.capabilities & hello.capabilities,
                peer_incarnation: hello.incarnation,
            },
            deadline: self.deadline,
        };
        Ok((next, reply))
    }
}

/// The acceptor, waiting for the dialer's confirm.
#[derive(Debug)]
pub struct AcceptorAwaitConfirm {
    key: Option<Vec<u8>>,
    hello: [u8; HELLO_BYTES],
    reply: [u8; HELLO_BYTES],
    established: Established,
    deadline: u64,
}

impl AcceptorAwaitConfirm {
    /// Takes the confirm: the link is admitted.
    ///
    /// # Errors
    /// A [`Refusal`]: the link must be closed.
    pub fn on_confirm(self, bytes: &[u8], now: u64) -> Result<Established, Refusal> {
        if now > self.deadline {
            return Err(Refusal::Timeout);
        }
        if bytes.len() != CONFIRM_BYTES || bytes[0] != KIND_CONFIRM {
            return Err(Refusal::Malformed);
        }
        verify(
            self.key.as_deref(),
            LABEL_DIAL,
            &self.hello,
            &self.reply,
            &bytes[1..],
        )?;
        Ok(self.established)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(replica: u8, links: u16, secret: Option<&[u8]>) -> HandshakeConfig {
        HandshakeConfig {
            cluster: 0xb4a1d,
            replica,
            replica_count: 3,
            links,
            capabilities: CAPABILITY_LIGHT_FRAMES,
            keys: secret.map_or(LinkKeys::Off, |s| LinkKeys::Shared(s.to_vec())),
            incarnation: 100 + u64::from(replica),
        }
    }

    /// Member `replica`'s keys of a cluster of three: one per pair it is in.
    fn per_peer(replica: u8, links: u16) -> HandshakeConfig {
        let pair = |a: u8, b: u8| vec![a.min(b), a.max(b), 0x5a];
        let keys = (0..3)
            .filter(|peer| *peer != replica)
            .map(|peer| (peer, pair(replica, peer)))
            .collect();
        HandshakeConfig {
            keys: LinkKeys::PerPeer(keys),
            ..config(replica, links, None)
        }
    }

    #[test]
    fn with_a_key_per_pair_a_member_can_prove_only_its_own_id() {
        let (dialed, accepted) = run(per_peer(0, 2), per_peer(2, 2), |_| {}).unwrap();
        assert_eq!((dialed.peer, accepted.peer), (2, 0));
        run(per_peer(1, 2), per_peer(2, 2), |_| {}).unwrap();
        // Member 0 claims to be member 1 when dialing member 2 (found by review: any
        // holder of the cluster secret could): it holds no key of the pair 1-2.
        let impostor = HandshakeConfig {
            replica: 1,
            ..per_peer(0, 2)
        };
        assert_eq!(run(impostor, per_peer(2, 2), |_| {}), Err(Refusal::BadMac));
        // A member without a key for the peer refuses it.
        let mut lacking = per_peer(2, 2);
        if let LinkKeys::PerPeer(keys) = &mut lacking.keys {
            keys.remove(&0);
        }
        assert_eq!(run(per_peer(0, 2), lacking, |_| {}), Err(Refusal::BadMac));
    }

    fn run(
        dialer: HandshakeConfig,
        acceptor: HandshakeConfig,
        tamper: impl Fn(&mut Vec<u8>),
    ) -> Result<(Established, Established), Refusal> {
        run_generation(dialer, acceptor, 7, tamper)
    }

    fn run_generation(
        dialer: HandshakeConfig,
        acceptor: HandshakeConfig,
        generation: u32,
        tamper: impl Fn(&mut Vec<u8>),
    ) -> Result<(Established, Established), Refusal> {
        let (dial, mut bytes) =
            DialerAwaitReply::start(dialer, acceptor.replica, 1, generation, [1; 16]);
        tamper(&mut bytes);
        let mut preamble = [0u8; PREAMBLE_BYTES];
        preamble.copy_from_slice(&bytes[..PREAMBLE_BYTES]);
        let accept = accept_preamble(acceptor, &preamble, 0, 100)?;
        let (accept, reply) = accept.on_hello(&bytes[PREAMBLE_BYTES..], [2; 16], 1)?;
        let (dialed, confirm) = dial.on_reply(&reply)?;
        let accepted = accept.on_confirm(&confirm, 2)?;
        Ok((dialed, accepted))
    }

    #[test]
    fn both_sides_admit_with_the_same_secret() {
        let (dialed, accepted) = run(
            config(0, 2, Some(b"s3cret")),
            config(1, 2, Some(b"s3cret")),
            |_| {},
        )
        .unwrap();
        assert_eq!(dialed.peer, 1);
        assert_eq!(accepted.peer, 0);
        assert_eq!((accepted.link, accepted.generation), (1, 7));
        assert_eq!(accepted.capabilities, CAPABILITY_LIGHT_FRAMES);
        // Without auth the same flow works.
        run(config(0, 2, None), config(1, 2, None), |_| {}).unwrap();
    }

    #[test]
    fn refusals_are_typed() {
        assert_eq!(
            run(config(0, 2, Some(b"a")), config(1, 2, Some(b"b")), |_| {}),
            Err(Refusal::BadMac)
        );
        assert_eq!(
            run(config(0, 4, None), config(1, 2, None), |_| {}),
            Err(Refusal::LinkCount { ours: 2, theirs: 4 })
        );
        assert_eq!(
            run(config(0, 3, None), config(1, 2, None), |_| {}),
            Err(Refusal::LinkCount { ours: 2, theirs: 3 })
        );
        assert_eq!(
            run(config(0, 2, None), config(1, 2, None), |b| b[0] = b'X'),
            Err(Refusal::BadMagic)
        );
        assert_eq!(
            run(config(0, 2, None), config(1, 2, None), |b| b[3] = 9),
            Err(Refusal::UnknownReplica(9))
        );
        // The hello must agree with the preamble (here: another generation).
        assert_eq!(
            run(config(0, 2, None), config(1, 2, None), |b| b[7] = 8),
            Err(Refusal::PreambleMismatch)
        );
        // Tampering with a signed field breaks the MAC.
        let tampered = run(config(0, 2, Some(b"k")), config(1, 2, Some(b"k")), |b| {
            b[8 + 19] ^= 1
        });
        assert_eq!(tampered, Err(Refusal::BadMac));
        let mut other = config(1, 2, None);
        other.cluster = 1;
        assert!(matches!(
            run(config(0, 2, None), other, |_| {}),
            Err(Refusal::Cluster { .. })
        ));
    }

    #[test]
    fn a_higher_id_may_not_dial_a_lower_one() {
        // Before: replica 2 could dial replica 1 and take over its bundle.
        assert_eq!(
            run(config(2, 2, None), config(1, 2, None), |_| {}),
            Err(Refusal::WrongDialer {
                dialer: 2,
                acceptor: 1
            })
        );
    }

    #[test]
    fn generations_past_24_bits_still_link_with_all_32_bits() {
        // Before: the preamble's 24 bits and the hello's 32 disagreed past 2^24, and
        // every link was refused.
        for generation in [(1 << 24) - 1, 1 << 24, (1 << 24) + 5, u32::MAX] {
            let (dialed, accepted) = run_generation(
                config(0, 2, Some(b"k")),
                config(1, 2, Some(b"k")),
                generation,
                |_| {},
            )
            .unwrap();
            assert_eq!(dialed.generation, generation);
            assert_eq!(accepted.generation, generation);
        }
    }

    #[test]
    fn one_deadline_covers_preamble_and_handshake() {
        let acceptor = config(1, 2, None);
        let (_, bytes) = DialerAwaitReply::start(config(0, 2, None), 1, 0, 1, [0; 16]);
        let mut preamble = [0u8; PREAMBLE_BYTES];
        preamble.copy_from_slice(&bytes[..PREAMBLE_BYTES]);
        // Accepted at tick 0 with a grace of 10: the preamble arrives at 8 (0.8 of the
        // grace); the hello at 11 is past the same deadline.
        let accept = accept_preamble(acceptor, &preamble, 8, 10).unwrap();
        assert_eq!(
            accept
                .on_hello(&bytes[PREAMBLE_BYTES..], [0; 16], 11)
                .unwrap_err(),
            Refusal::Timeout
        );
    }

    #[test]
    fn preamble_round_trips() {
        let p = Preamble {
            replica: 3,
            link: 2,
            generation: 0x00ab_cdef,
        };
        assert_eq!(Preamble::decode(&p.encode()), Ok(p));
        let mut bad = p.encode();
        bad[2] = 9;
        assert_eq!(Preamble::decode(&bad), Err(Refusal::Version(9)));
    }
}
