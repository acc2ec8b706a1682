//! The native client protocol: length-prefixed binary frames over TCP.
//!
//! Every request frame is
//!
//! | byte | size | field |
//! | ---: | ---: | --- |
//! | 0 | 4 | `length: u32`: bytes after this field |
//! | 4 | 8 | `request_id: u64`: chosen by the client, echoed in the response |
//! | 12 | 2 | `command: u16`: a [`Command`] code |
//! | 14 | … | body |
//!
//! and every response frame is
//!
//! | byte | size | field |
//! | ---: | ---: | --- |
//! | 0 | 4 | `length: u32` |
//! | 4 | 8 | `request_id: u64` |
//! | 12 | 2 | `command: u16`: the request's command |
//! | 14 | 2 | `status: u16`: 0, or an [`ErrorCode`] |
//! | 16 | … | body; for an error, a string with the message, then typed details ([`ErrorBody`]) |
//!
//! A client may send many requests without waiting (pipelining); responses to the
//! requests on one connection come back in any order, matched by `request_id`.
//! `docs/protocol.md` specifies each body.

mod access;
mod error_body;
mod node_status;
mod request;
pub(crate) use request::check_name;
mod response;

pub use access::{
    parse_permissions, permission_names, Grant, Resource, UserSummary, MANAGE, NODE_PERMISSIONS,
    READ, STREAMS, STREAM_PERMISSIONS, USERS, WRITE,
};

pub use error_body::{ErrorBody, ErrorDetail};
pub use node_status::{
    GroupBehind, NodeStatus, PeerBundle, ReplicaStatus, GROUPS_BEHIND_LISTED_MAX,
};
pub use request::{
    GroupMemberRequest, OffsetSpec, Request, SettingOutOfRange, TopicSettings, FSYNC_ALWAYS,
    FSYNC_DEFAULT, FSYNC_INTERVAL, FSYNC_INTERVAL_MS_MAX, FSYNC_NEVER, MAX_BATCH_BYTES_MIN,
    MEMBER_NAME_BYTES_MAX, RETENTION_BYTES_MAX, RETENTION_FOREVER, RETENTION_MS_MAX,
    SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN, TOPIC_PARTITIONS_MAX,
};
pub use response::{
    decode_error_message, encode_fetch_prefix, error_code, ClusterInfo, ClusterMember,
    GroupDescription, GroupMember, GroupSummary, PartitionInfo, PartitionOffsets, PartitionPrimary,
    Response, StreamSummary, TopicInfo, TopicPrimaries, TopicSummary,
};

use crate::wire::{WireError, WireReader};

/// Bytes of a request header, length field included.
pub const REQUEST_HEADER_BYTES: usize = 14;
/// Bytes of a response header, length field included.
pub const RESPONSE_HEADER_BYTES: usize = 16;
/// Bytes of the length field.
pub const LENGTH_BYTES: usize = 4;
/// Default largest frame a node accepts (length field value), 16 MiB.
pub const FRAME_BYTES_MAX_DEFAULT: u32 = 16 << 20;
/// Longest stream, topic or group name, in bytes.
pub const NAME_BYTES_MAX: usize = 249;

macro_rules! codes {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $code:expr,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u16)]
        $vis enum $name {
            $($(#[$vmeta])* $variant = $code,)*
        }

        impl $name {
            /// Every code, in order.
            pub const ALL: &'static [Self] = &[$(Self::$variant,)*];

            /// The code of a number, if it names one.
            pub fn from_u16(code: u16) -> Option<Self> {
                match code {
                    $($code => Some(Self::$variant),)*
                    _ => None,
                }
            }

            /// The code's name, as in `docs/protocol.md`.
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => stringify!($variant),)*
                }
            }
        }
    };
}

codes! {
    /// Request kinds. The numbers are stable: they are the wire format.
    pub enum Command {
        /// Liveness check.
        Ping = 1,
        /// One step of SCRAM-SHA-256 authentication.
        Authenticate = 2,
        /// Create a stream (a namespace of topics).
        CreateStream = 10,
        /// Delete a stream and its topics.
        DeleteStream = 11,
        /// List streams.
        ListStreams = 12,
        /// Create a topic.
        CreateTopic = 20,
        /// Delete a topic and its data.
        DeleteTopic = 21,
        /// List the topics of a stream.
        ListTopics = 22,
        /// A topic's partitions, ranges, offsets and settings.
        DescribeTopic = 23,
        /// Append a batch to a partition.
        Produce = 30,
        /// Read batches from a partition.
        Fetch = 31,
        /// Earliest, latest or by-timestamp offset of a partition.
        ListOffsets = 32,
        /// Join a consumer group.
        JoinGroup = 40,
        /// Keep a membership alive and learn the assignment.
        Heartbeat = 41,
        /// Leave a consumer group.
        LeaveGroup = 42,
        /// Commit consumed offsets.
        CommitOffsets = 43,
        /// Read committed offsets.
        FetchOffsets = 44,
        /// List the groups of a stream.
        ListGroups = 45,
        /// A group's members, assignment, offsets and lag.
        DescribeGroup = 46,
        /// Create a user with a SCRAM credential.
        CreateUser = 50,
        /// Delete a user and its grants.
        DeleteUser = 51,
        /// List users with their grants.
        ListUsers = 52,
        /// Add permissions on a resource to a user.
        GrantPermissions = 53,
        /// Take permissions on a resource from a user.
        RevokePermissions = 54,
        /// Replace a user's SCRAM credential (a new password); ends its connections.
        ChangePassword = 55,
        /// The cluster's members and each partition's primary (any node answers).
        ClusterInfo = 60,
        /// The answering member's replicas summed up and its bundle to each peer.
        NodeStatus = 61,
        /// Open a client session (the coordinator answers its id).
        RegisterSession = 70,
        /// End a client session.
        EndSession = 71,
        /// Keep a client session open.
        SessionHeartbeat = 72,
    }
}

codes! {
    /// Why a request failed. The numbers are stable: they are the wire format.
    #[non_exhaustive]
    pub enum ErrorCode {
        /// The frame's body could not be decoded.
        MalformedRequest = 1,
        /// The command code is unknown.
        UnknownCommand = 2,
        /// The frame exceeds the node's maximum; the connection is closed after this.
        FrameTooLarge = 3,
        /// A name or number is out of range.
        InvalidArgument = 4,
        /// No such stream.
        StreamNotFound = 10,
        /// The stream exists already.
        StreamExists = 11,
        /// No such topic.
        TopicNotFound = 12,
        /// The topic exists already.
        TopicExists = 13,
        /// No such partition.
        PartitionNotFound = 14,
        /// The batch failed validation (CRC, lengths, compression...).
        InvalidBatch = 20,
        /// The batch exceeds the topic's maximum batch size.
        BatchTooLarge = 21,
        /// The offset is below the start or beyond the end of the partition.
        OffsetOutOfRange = 22,
        /// This node does not lead the partition (a cluster answer; `hint` in the message).
        NotLeader = 23,
        /// The partition is sealed by a split or merge.
        PartitionSealed = 24,
        /// A keyed record's key hash lies outside the partition's hash range: the
        /// producer's layout is stale; refresh it and route again.
        KeyOutOfRange = 25,
        /// A produce of a session repeats a request older than the last one the
        /// partition applied for it: that request was stored, and its offsets are no
        /// longer kept (a `LastRequest` detail names the last). Not retriable.
        DuplicateRequest = 26,
        /// A produce of a session skips a request number on its partition: an earlier
        /// request is missing (an `ExpectedRequest` detail names the next number the
        /// partition takes). Send the missing ones first.
        RequestOutOfOrder = 27,
        /// No such client session: never registered, ended or retired. Register a new
        /// one (a request whose answer was lost under the old one has an unknown
        /// outcome: it may be stored).
        SessionNotFound = 28,
        /// No such consumer group.
        GroupNotFound = 30,
        /// The member is not (or no longer) in the group.
        UnknownMember = 31,
        /// The member's generation is old: it must heartbeat for the new assignment.
        StaleGeneration = 32,
        /// The member does not own the partition it commits for.
        NotAssigned = 33,
        /// The disk refused a write or a read found damage.
        StorageError = 40,
        /// The node is shutting down.
        ShuttingDown = 41,
        /// The node is overloaded; retry later.
        Busy = 42,
        /// One of the node's limits (members per group, groups, ...) would be passed;
        /// the message names the setting.
        QuotaExceeded = 43,
        /// Wrong user name or password (the same code for both); the connection is
        /// closed after this.
        AuthenticationFailed = 60,
        /// The node requires authentication and this connection has not authenticated.
        NotAuthenticated = 61,
        /// The user lacks the permission the request needs; the message names it.
        PermissionDenied = 62,
        /// No such user.
        UserNotFound = 63,
        /// The user exists already.
        UserExists = 64,
        /// A bug in the node; the message says more.
        Internal = 50,
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), *self as u16)
    }
}

/// The decoded header of a request frame (after the length field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// Chosen by the client, echoed in the response.
    pub request_id: u64,
    /// The raw command code (it may name no [`Command`]).
    pub command: u16,
}

/// The decoded header of a response frame (after the length field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHeader {
    /// The request's id.
    pub request_id: u64,
    /// The request's command code.
    pub command: u16,
    /// 0 for success, else an [`ErrorCode`] number.
    pub status: u16,
}

/// Why a frame could not be taken from a byte stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The length field exceeds the maximum: the stream cannot be framed any further.
    #[error("frame of {length} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// The length field.
        length: u32,
        /// The maximum.
        max: u32,
    },
    /// The length field is smaller than the header it must cover.
    #[error("frame length {length} is shorter than its header")]
    TooShort {
        /// The length field.
        length: u32,
    },
}

/// Looks at the start of a byte stream: `Ok(Some(total))` once a whole frame of `total`
/// bytes (length field included) is buffered, `Ok(None)` while more bytes are needed.
/// `header_bytes` is [`REQUEST_HEADER_BYTES`] or [`RESPONSE_HEADER_BYTES`].
///
/// # Errors
/// [`FrameError`] when the length field is out of range; the caller must close the
/// connection, as the stream can no longer be framed.
pub fn frame_length(
    buffered: &[u8],
    header_bytes: usize,
    max: u32,
) -> Result<Option<usize>, FrameError> {
    let Some(raw) = buffered.get(..LENGTH_BYTES) else {
        return Ok(None);
    };
    let length = u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]);
    if length > max {
        return Err(FrameError::TooLarge { length, max });
    }
    if (length as usize) < header_bytes - LENGTH_BYTES {
        return Err(FrameError::TooShort { length });
    }
    let total = LENGTH_BYTES + length as usize;
    Ok((buffered.len() >= total).then_some(total))
}

/// Splits a whole request frame (as measured by [`frame_length`]) into its header and
/// body.
///
/// # Errors
/// [`WireError::Truncated`] if `frame` is shorter than a header.
pub fn split_request(frame: &[u8]) -> Result<(RequestHeader, &[u8]), WireError> {
    let mut reader = WireReader::new(frame);
    reader.u32("length")?;
    let request_id = reader.u64("request_id")?;
    let command = reader.u16("command")?;
    Ok((
        RequestHeader {
            request_id,
            command,
        },
        &frame[REQUEST_HEADER_BYTES..],
    ))
}

/// Splits a whole response frame into its header and body.
///
/// # Errors
/// [`WireError::Truncated`] if `frame` is shorter than a header.
pub fn split_response(frame: &[u8]) -> Result<(ResponseHeader, &[u8]), WireError> {
    let mut reader = WireReader::new(frame);
    reader.u32("length")?;
    let request_id = reader.u64("request_id")?;
    let command = reader.u16("command")?;
    let status = reader.u16("status")?;
    let header = ResponseHeader {
        request_id,
        command,
        status,
    };
    Ok((header, &frame[RESPONSE_HEADER_BYTES..]))
}

/// Starts a frame in `out`: a placeholder length and the header. Finish it with
/// [`finish_frame`] after appending the body.
pub fn begin_request(out: &mut Vec<u8>, request_id: u64, command: Command) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&request_id.to_be_bytes());
    out.extend_from_slice(&(command as u16).to_be_bytes());
    start
}

/// Starts a response frame in `out`; see [`begin_request`].
pub fn begin_response(out: &mut Vec<u8>, request_id: u64, command: u16, status: u16) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&request_id.to_be_bytes());
    out.extend_from_slice(&command.to_be_bytes());
    out.extend_from_slice(&status.to_be_bytes());
    start
}

/// Writes the length field of the frame that starts at `start`.
pub fn finish_frame(out: &mut [u8], start: usize) {
    let length = (out.len() - start - LENGTH_BYTES) as u32;
    out[start..start + LENGTH_BYTES].copy_from_slice(&length.to_be_bytes());
}

/// Appends a whole error response: the message, then the details (see [`ErrorBody`]).
pub fn encode_error(
    out: &mut Vec<u8>,
    request_id: u64,
    command: u16,
    code: ErrorCode,
    message: &str,
    details: &[ErrorDetail],
) {
    let start = begin_response(out, request_id, command, code as u16);
    ErrorBody::encode(message, details, out);
    finish_frame(out, start);
}

#[cfg(test)]
mod tests;
