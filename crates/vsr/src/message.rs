//! Prepares, their checksums, and the messages replicas and clients exchange.

use bytes::Bytes;

use crate::durable::Checkpoint;

/// A replica's index in its group, `0..replica_count`.
pub type ReplicaId = u8;

/// A 128-bit checksum: the chain of parent checksums pins a whole log, so it must not
/// collide by accident. Not a MAC: peers are authenticated by the bus.
pub type Checksum = u128;

/// The checksum of `bytes` (XXH3-128).
pub fn checksum(bytes: &[u8]) -> Checksum {
    xxhash_rust::xxh3::xxh3_128(bytes)
}

/// What an op does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// Op 0: the same on every replica, the start of every chain.
    Root,
    /// Registers a client session; the op number becomes the session id.
    Register,
    /// A client request for the state machine.
    Request,
}

/// The header of a prepare. `checksum` covers every other field, including the
/// parent's checksum, so one checksum pins down the whole log below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// The consensus group.
    pub group: u64,
    /// The view the op was prepared in.
    pub view: u64,
    /// The op number.
    pub op: u64,
    /// The primary's commit number when it prepared the op.
    pub commit: u64,
    /// Checksum of op - 1's header.
    pub parent: Checksum,
    /// Checksum of the body.
    pub body_checksum: Checksum,
    /// The client session (0 for a register).
    pub session: u64,
    /// The client's request number.
    pub request: u64,
    /// What the op does.
    pub operation: Operation,
    /// Checksum of all of the above.
    pub checksum: Checksum,
}

impl Header {
    /// The bytes the checksum covers: every field but `checksum`, fixed-width, big-endian.
    pub(crate) const FIELDS_BYTES: usize = 6 * 8 + 2 * 16 + 1;

    pub(crate) fn fields(&self) -> [u8; Self::FIELDS_BYTES] {
        let mut out = [0u8; Self::FIELDS_BYTES];
        let words = [
            self.group,
            self.view,
            self.op,
            self.commit,
            self.session,
            self.request,
        ];
        for (i, word) in words.iter().enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&word.to_be_bytes());
        }
        out[48..64].copy_from_slice(&self.parent.to_be_bytes());
        out[64..80].copy_from_slice(&self.body_checksum.to_be_bytes());
        out[80] = match self.operation {
            Operation::Root => 0,
            Operation::Register => 1,
            Operation::Request => 2,
        };
        out
    }

    /// The checksum the header should carry.
    pub fn compute_checksum(&self) -> Checksum {
        checksum(&self.fields())
    }

    /// Sets `checksum` from the other fields.
    pub fn seal(mut self) -> Self {
        self.checksum = self.compute_checksum();
        self
    }

    /// Whether the header's checksum matches its fields.
    pub fn valid(&self) -> bool {
        self.checksum == self.compute_checksum()
    }

    /// The root header (op 0) of a group.
    pub fn root(group: u64) -> Self {
        Self {
            group,
            view: 0,
            op: 0,
            commit: 0,
            parent: 0,
            body_checksum: checksum(&[]),
            session: 0,
            request: 0,
            operation: Operation::Root,
            checksum: 0,
        }
        .seal()
    }
}

/// A prepared op: header and body.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Prepare {
    /// The header.
    pub header: Header,
    /// The body.
    pub body: Bytes,
}

impl Prepare {
    /// Whether header and body checksums hold.
    pub fn valid(&self) -> bool {
        self.header.valid() && self.header.body_checksum == checksum(&self.body)
    }
}

/// Why a client request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The session is not registered, or was evicted for capacity.
    SessionUnknown,
    /// The request number is below one already answered.
    RequestTooOld,
}

/// A client request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Request {
    /// The client (the sim's id; replies go to it).
    pub client: u64,
    /// The session, 0 to register.
    pub session: u64,
    /// The request number within the session (1, 2, ...; 0 for a register).
    pub request: u64,
    /// The operation's input.
    pub body: Bytes,
}

/// The answer to a client.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reply {
    /// The client.
    pub client: u64,
    /// The session (for a register: the new session id).
    pub session: u64,
    /// The request number answered (the attempt number, for a register).
    pub request: u64,
    /// Whether this answers a register.
    pub register: bool,
    /// The view the primary was in.
    pub view: u64,
    /// The result, or why it was refused.
    pub result: Result<Vec<u8>, Refusal>,
}

/// One op's entry in a view change: its header, and its body if the sender has it
/// intact (a header without body is a known but damaged entry: never a nack).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SuffixEntry {
    /// The header.
    pub header: Header,
    /// The body, if intact.
    pub body: Option<Bytes>,
}

/// Messages between replicas (and from clients).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Message {
    /// From a client.
    Request(Request),
    /// Primary to backups: append this op. Also the answer to a repair request.
    Prepare(Prepare),
    /// Backup to primary: the op is in my journal.
    PrepareOk {
        /// The view.
        view: u64,
        /// The op.
        op: u64,
        /// Its checksum.
        checksum: Checksum,
        /// The sender.
        from: ReplicaId,
    },
    /// Primary to backups: everything up to `commit` is committed (also a heartbeat).
    Commit {
        /// The view.
        view: u64,
        /// The commit number.
        commit: u64,
        /// The checksum of the op at `commit`, anchoring the chain below it.
        checksum: Checksum,
        /// The sender.
        from: ReplicaId,
    },
    /// A replica wants to move to `view`.
    StartViewChange {
        /// The new view.
        view: u64,
        /// The sender.
        from: ReplicaId,
    },
    /// A replica's log suffix for the new primary of `view`.
    DoViewChange {
        /// The new view.
        view: u64,
        /// The last view in which the sender was normal.
        log_view: u64,
        /// The sender's highest op.
        op: u64,
        /// The sender's commit number.
        commit: u64,
        /// The checksum of the op at `commit`, if the sender's journal holds it as
        /// committed (proven by the chain): a top for a log whose best vote is shorter.
        commit_checksum: Option<Checksum>,
        /// Entries from the sender's commit (its anchor) to its op.
        suffix: Vec<SuffixEntry>,
        /// Ops in the suffix's range whose slots the sender knows it wrote but cannot
        /// read: never counted as "never had" (the other absent ops are).
        faulty: Vec<u64>,
        /// Ops above this may be ones the sender acknowledged and lost (its journal was
        /// not synced before a restart): never counted as "never had". `u64::MAX` when
        /// its journal is trusted.
        trusted_through: u64,
        /// The sender.
        from: ReplicaId,
    },
    /// The new primary's log suffix: install it and follow.
    StartView {
        /// The view.
        view: u64,
        /// The primary's highest op.
        op: u64,
        /// The commit number.
        commit: u64,
        /// Headers from the commit anchor to `op`; bodies for the uncommitted ones.
        suffix: Vec<SuffixEntry>,
        /// The sender.
        from: ReplicaId,
    },
    /// Asks for the prepare at `op` with `checksum` (any replica may answer).
    RequestPrepare {
        /// The op.
        op: u64,
        /// Its expected checksum.
        checksum: Checksum,
        /// The sender.
        from: ReplicaId,
    },
    /// Asks the primary of `view` to send its StartView again.
    RequestStartView {
        /// The view the sender is in.
        view: u64,
        /// The sender.
        from: ReplicaId,
    },
    /// Backup to primary: ops through `commit` are committed (it knows it, from an
    /// earlier view), so a primary whose commit lags need not wait for acknowledgements
    /// of ops the backup may no longer hold in memory.
    Committed {
        /// The view.
        view: u64,
        /// The backup's commit number.
        commit: u64,
        /// The checksum of the op at `commit`.
        checksum: Checksum,
        /// The sender.
        from: ReplicaId,
    },
    /// A replica restarted untrusted asks which view each peer is in. One that lost its
    /// disk may regain trust only in a view at least as new as any a quorum of them
    /// names; any may regain it in its own view once it holds the log its primary
    /// answered with.
    RequestViews {
        /// The sender.
        from: ReplicaId,
        /// Drawn by this incarnation of the sender: only an answer that echoes it
        /// counts, never one to a request from before the restart.
        nonce: u64,
    },
    /// The answer: the highest view the sender has taken part in.
    Views {
        /// That view.
        view: u64,
        /// The sender's op, if it is the normal primary of `view`: every op the asker
        /// could have acknowledged in that view before its restart is at or below it.
        primary_op: Option<u64>,
        /// The sender.
        from: ReplicaId,
        /// The request's nonce.
        nonce: u64,
    },
    /// Asks for the applied state (the sender is behind every journal).
    RequestSnapshot {
        /// The sender.
        from: ReplicaId,
    },
    /// The applied state at `checkpoint.header.op` (state transfer).
    Snapshot {
        /// The state, checksummed.
        checkpoint: Checkpoint,
        /// The sender's view when it sent this: the op was committed in this view or an
        /// earlier one. (The header's view is only the view that prepared the op.)
        view: u64,
        /// The sender.
        from: ReplicaId,
    },
}

impl Message {
    /// The replica that sent it, for replica messages.
    pub fn from(&self) -> Option<ReplicaId> {
        match self {
            Self::Request(_) | Self::Prepare(_) => None,
            Self::PrepareOk { from, .. }
            | Self::Commit { from, .. }
            | Self::StartViewChange { from, .. }
            | Self::DoViewChange { from, .. }
            | Self::StartView { from, .. }
            | Self::RequestPrepare { from, .. }
            | Self::RequestStartView { from, .. }
            | Self::Committed { from, .. }
            | Self::RequestSnapshot { from }
            | Self::RequestViews { from, .. }
            | Self::Views { from, .. }
            | Self::Snapshot { from, .. } => Some(*from),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_checksum_covers_every_field_and_the_parent() {
        let root = Header::root(7);
        assert!(root.valid());
        let header = Header {
            group: 7,
            view: 1,
            op: 1,
            commit: 0,
            parent: root.checksum,
            body_checksum: checksum(b"x"),
            session: 3,
            request: 1,
            operation: Operation::Request,
            checksum: 0,
        }
        .seal();
        assert!(header.valid());
        for changed in [
            Header { view: 2, ..header },
            Header {
                parent: 1,
                ..header
            },
            Header {
                request: 2,
                ..header
            },
            Header {
                operation: Operation::Register,
                ..header
            },
        ] {
            assert!(!changed.valid());
        }
        let prepare = Prepare {
            header,
            body: Bytes::from_static(b"x"),
        };
        assert!(prepare.valid());
        assert!(!Prepare {
            header,
            body: Bytes::from_static(b"y")
        }
        .valid());
    }
}
