//! Request bodies.

use super::{Command, NAME_BYTES_MAX};
use crate::wire::{WireError, WireReader, WireWrite};

/// `fsync` mode value: the node's default.
pub const FSYNC_DEFAULT: u8 = 0;
/// `fsync` mode value: always.
pub const FSYNC_ALWAYS: u8 = 1;
/// `fsync` mode value: at an interval.
pub const FSYNC_INTERVAL: u8 = 2;
/// `fsync` mode value: never.
pub const FSYNC_NEVER: u8 = 3;

/// Most partitions a topic may be created with.
pub const TOPIC_PARTITIONS_MAX: u32 = 10_000;
/// Longest consumer group member name (a name for people; it is kept by the
/// coordinator and shown in every `DescribeGroup`).
pub const MEMBER_NAME_BYTES_MAX: usize = 255;
/// The one explicit "keep forever" form of [`TopicSettings::retention_ms`], and "no
/// size limit" of [`TopicSettings::retention_bytes`]: `u64::MAX` (2^64 − 1). The CLI
/// and the node's config spell it `forever`. (0 on the wire is the node's default.)
pub const RETENTION_FOREVER: u64 = u64::MAX;
/// Longest retention by age other than [`RETENTION_FOREVER`]: 100 years of 365.25 days,
/// in ms (3,155,760,000,000).
pub const RETENTION_MS_MAX: u64 = 36_525 * 24 * 3600 * 1000;
/// Largest retention by size other than [`RETENTION_FOREVER`]: 1 EiB per partition.
pub const RETENTION_BYTES_MAX: u64 = 1 << 60;
/// Longest `fsync_interval_ms`: one hour. Data that may wait longer for its sync is
/// better served by `never`, which says so.
pub const FSYNC_INTERVAL_MS_MAX: u64 = 3_600_000;
/// Smallest log segment size (1 KiB; the storage's `SEGMENT_BYTES_MIN`).
pub const SEGMENT_BYTES_MIN: u32 = 1024;
/// Largest log segment size (2 GiB − 1; the storage's `SEGMENT_BYTES_MAX`): index
/// entries hold 32-bit positions.
pub const SEGMENT_BYTES_MAX: u32 = i32::MAX as u32;
/// Smallest `max_batch_bytes` (1 KiB); the largest is [`SEGMENT_BYTES_MAX`], and a
/// topic's must also fit in its segments and in the node's frames.
pub const MAX_BATCH_BYTES_MIN: u32 = 1024;

/// Settings of a new topic. Zero in a size or time field means "the node's default";
/// [`RETENTION_FOREVER`] in a retention field means no limit. [`TopicSettings::check`]
/// states every field's range, and a CreateTopic request whose settings break it is
/// refused at decode ([`WireError::OutOfRange`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TopicSettings {
    /// Number of partitions, 1 to [`TOPIC_PARTITIONS_MAX`].
    pub partitions: u32,
    /// [`FSYNC_DEFAULT`], [`FSYNC_ALWAYS`], [`FSYNC_INTERVAL`] or [`FSYNC_NEVER`].
    pub fsync: u8,
    /// Interval for [`FSYNC_INTERVAL`] (ms), at most [`FSYNC_INTERVAL_MS_MAX`]; 0: the
    /// node's default.
    pub fsync_interval_ms: u64,
    /// Retention by size per partition (bytes), at most [`RETENTION_BYTES_MAX`]; 0: the
    /// node's default; [`RETENTION_FOREVER`]: no size limit.
    pub retention_bytes: u64,
    /// Retention by age (ms), at most [`RETENTION_MS_MAX`]; 0: the node's default;
    /// [`RETENTION_FOREVER`]: keep forever.
    pub retention_ms: u64,
    /// Largest batch a producer may send (bytes), [`MAX_BATCH_BYTES_MIN`] to
    /// [`SEGMENT_BYTES_MAX`]; 0: the node's default.
    pub max_batch_bytes: u32,
    /// Log segment size (bytes), [`SEGMENT_BYTES_MIN`] to [`SEGMENT_BYTES_MAX`]; 0: the
    /// node's default.
    pub segment_bytes: u32,
}

/// A [`TopicSettings`] field outside its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{field} = {value} is out of range: {range}")]
pub struct SettingOutOfRange {
    /// The field.
    pub field: &'static str,
    /// Its value.
    pub value: u64,
    /// The values it may take.
    pub range: &'static str,
}

/// Byte offsets of the fields in the settings' wire form.
const OFFSET_PARTITIONS: usize = 0;
const OFFSET_FSYNC_INTERVAL_MS: usize = 5;
const OFFSET_RETENTION_BYTES: usize = 13;
const OFFSET_RETENTION_MS: usize = 21;
const OFFSET_MAX_BATCH_BYTES: usize = 29;
const OFFSET_SEGMENT_BYTES: usize = 33;

impl TopicSettings {
    /// Bytes of the settings' wire form.
    pub const WIRE_BYTES: usize = 37;

    /// Appends the settings' wire form.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.put_u32_be(self.partitions);
        out.put_u8_be(self.fsync);
        out.put_u64_be(self.fsync_interval_ms);
        out.put_u64_be(self.retention_bytes);
        out.put_u64_be(self.retention_ms);
        out.put_u32_be(self.max_batch_bytes);
        out.put_u32_be(self.segment_bytes);
    }

    /// Reads the settings' wire form, checking only that `fsync` names a mode: stored
    /// settings and [`TopicInfo`](super::TopicInfo) answers are read with it. A new
    /// topic's settings are read with [`TopicSettings::decode_checked`].
    ///
    /// # Errors
    /// A [`WireError`].
    pub fn decode(reader: &mut WireReader<'_>) -> Result<Self, WireError> {
        let partitions = reader.u32("partitions")?;
        let at = reader.position();
        let fsync = reader.u8("fsync")?;
        if fsync > FSYNC_NEVER {
            return Err(WireError::BadValue {
                at,
                field: "fsync",
                value: fsync.into(),
            });
        }
        Ok(Self {
            partitions,
            fsync,
            fsync_interval_ms: reader.u64("fsync_interval_ms")?,
            retention_bytes: reader.u64("retention_bytes")?,
            retention_ms: reader.u64("retention_ms")?,
            max_batch_bytes: reader.u32("max_batch_bytes")?,
            segment_bytes: reader.u32("segment_bytes")?,
        })
    }

    /// Reads a new topic's settings: [`TopicSettings::decode`], then every field
    /// checked against its range ([`TopicSettings::check`]).
    ///
    /// # Errors
    /// A [`WireError`]; [`WireError::OutOfRange`] for a field outside its range.
    pub fn decode_checked(reader: &mut WireReader<'_>) -> Result<Self, WireError> {
        let start = reader.position();
        let settings = Self::decode(reader)?;
        settings.check().map_err(|err| WireError::OutOfRange {
            at: start + field_offset(err.field),
            field: err.field,
            value: err.value,
            range: err.range,
        })?;
        Ok(settings)
    }

    /// Checks every field against its range, as a CreateTopic request states it (0
    /// is the node's default in every field but `partitions` and `fsync`).
    ///
    /// # Errors
    /// The first field out of range.
    pub fn check(&self) -> Result<(), SettingOutOfRange> {
        let refuse = |field, value: u64, range| {
            Err(SettingOutOfRange {
                field,
                value,
                range,
            })
        };
        if !(1..=TOPIC_PARTITIONS_MAX).contains(&self.partitions) {
            return refuse("partitions", self.partitions.into(), "1 to 10000");
        }
        if self.fsync > FSYNC_NEVER {
            return refuse("fsync", self.fsync.into(), "0 to 3");
        }
        if self.fsync_interval_ms > FSYNC_INTERVAL_MS_MAX {
            return refuse(
                "fsync_interval_ms",
                self.fsync_interval_ms,
                "0 (the node's default) or 1 to 3600000 (1 hour)",
            );
        }
        if !retention_in_range(self.retention_bytes, RETENTION_BYTES_MAX) {
            return refuse(
                "retention_bytes",
                self.retention_bytes,
                "0 (the node's default), 1 to 2^60 (1 EiB), or 2^64 - 1 (no size limit)",
            );
        }
        if !retention_in_range(self.retention_ms, RETENTION_MS_MAX) {
            return refuse(
                "retention_ms",
                self.retention_ms,
                "0 (the node's default), 1 to 3155760000000 (100 years), or \
                 2^64 - 1 = 18446744073709551615 (keep forever)",
            );
        }
        if self.max_batch_bytes != 0
            && !(MAX_BATCH_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&self.max_batch_bytes)
        {
            return refuse(
                "max_batch_bytes",
                self.max_batch_bytes.into(),
                "0 (the node's default) or 1024 to 2^31 - 1",
            );
        }
        if self.segment_bytes != 0
            && !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&self.segment_bytes)
        {
            return refuse(
                "segment_bytes",
                self.segment_bytes.into(),
                "0 (the node's default) or 1024 to 2^31 - 1",
            );
        }
        Ok(())
    }
}

/// Whether a retention setting is 0 (the default), at most `max`, or
/// [`RETENTION_FOREVER`].
fn retention_in_range(value: u64, max: u64) -> bool {
    value <= max || value == RETENTION_FOREVER
}

fn field_offset(field: &str) -> usize {
    match field {
        "partitions" => OFFSET_PARTITIONS,
        "fsync" => OFFSET_PARTITIONS + 4,
        "fsync_interval_ms" => OFFSET_FSYNC_INTERVAL_MS,
        "retention_bytes" => OFFSET_RETENTION_BYTES,
        "retention_ms" => OFFSET_RETENTION_MS,
        "max_batch_bytes" => OFFSET_MAX_BATCH_BYTES,
        _ => OFFSET_SEGMENT_BYTES,
    }
}

/// Which offset [`Request::ListOffsets`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    /// The earliest offset still stored (kind 0).
    Earliest,
    /// The offset the next record will get (kind 1).
    Latest,
    /// The first offset whose timestamp is at or after this (ms; kind 2).
    Timestamp(i64),
}

/// The member fields shared by [`Request::Heartbeat`] and [`Request::CommitOffsets`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMemberRequest<'a> {
    /// The stream of the group.
    pub stream: &'a str,
    /// The group.
    pub group: &'a str,
    /// The member id from [`Request::JoinGroup`].
    pub member_id: u64,
    /// The generation the member knows.
    pub generation: u32,
}

/// A request, borrowing its strings and batch from the frame.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request<'a> {
    /// See [`Command::Ping`].
    Ping,
    /// See [`Command::Authenticate`].
    Authenticate {
        /// The mechanism; only `SCRAM-SHA-256`.
        mechanism: &'a str,
        /// The client-first, then the client-final message.
        message: &'a [u8],
    },
    /// See [`Command::CreateUser`]: the user's SCRAM credential, derived by the client
    /// (the password never crosses the wire).
    CreateUser {
        /// User name (the name rule).
        name: &'a str,
        /// PBKDF2 salt.
        salt: &'a [u8],
        /// PBKDF2 iterations.
        iterations: u32,
        /// SCRAM `StoredKey`, 32 bytes.
        stored_key: &'a [u8],
        /// SCRAM `ServerKey`, 32 bytes.
        server_key: &'a [u8],
    },
    /// See [`Command::ChangePassword`]: the user's new credential, derived by the
    /// client as at [`Command::CreateUser`].
    ChangePassword {
        /// User name.
        name: &'a str,
        /// PBKDF2 salt.
        salt: &'a [u8],
        /// PBKDF2 iterations.
        iterations: u32,
        /// SCRAM `StoredKey`, 32 bytes.
        stored_key: &'a [u8],
        /// SCRAM `ServerKey`, 32 bytes.
        server_key: &'a [u8],
    },
    /// See [`Command::DeleteUser`].
    DeleteUser {
        /// User name.
        name: &'a str,
    },
    /// See [`Command::ListUsers`].
    ListUsers,
    /// See [`Command::ClusterInfo`].
    ClusterInfo,
    /// See [`Command::NodeStatus`].
    NodeStatus,
    /// See [`Command::RegisterSession`].
    RegisterSession {
        /// The session ends when no heartbeat comes for this long (ms).
        timeout_ms: u32,
    },
    /// See [`Command::EndSession`].
    EndSession {
        /// The session.
        session: u64,
    },
    /// See [`Command::SessionHeartbeat`].
    SessionHeartbeat {
        /// The session.
        session: u64,
    },
    /// See [`Command::GrantPermissions`].
    GrantPermissions {
        /// User name.
        user: &'a str,
        /// What to add.
        grant: super::Grant,
    },
    /// See [`Command::RevokePermissions`].
    RevokePermissions {
        /// User name.
        user: &'a str,
        /// What to take away.
        grant: super::Grant,
    },
    /// See [`Command::CreateStream`].
    CreateStream {
        /// Stream name.
        name: &'a str,
    },
    /// See [`Command::DeleteStream`].
    DeleteStream {
        /// Stream name.
        name: &'a str,
    },
    /// See [`Command::ListStreams`].
    ListStreams,
    /// See [`Command::CreateTopic`].
    CreateTopic {
        /// Stream name.
        stream: &'a str,
        /// Topic name.
        topic: &'a str,
        /// Settings.
        settings: TopicSettings,
    },
    /// See [`Command::DeleteTopic`].
    DeleteTopic {
        /// Stream name.
        stream: &'a str,
        /// Topic name.
        topic: &'a str,
    },
    /// See [`Command::ListTopics`].
    ListTopics {
        /// Stream name.
        stream: &'a str,
    },
    /// See [`Command::DescribeTopic`].
    DescribeTopic {
        /// Stream name.
        stream: &'a str,
        /// Topic name.
        topic: &'a str,
    },
    /// See [`Command::Produce`].
    Produce {
        /// Stream name.
        stream: &'a str,
        /// Topic name.
        topic: &'a str,
        /// Partition id.
        partition: u32,
        /// One record batch in the stored format.
        batch: &'a [u8],
    },
    /// See [`Command::Fetch`].
    Fetch {
        /// Stream name.
        stream: &'a str,
        /// Topic name.
        topic: &'a str,
        /// Partition id.
        partition: u32,
        /// First offset wanted.
        offset: u64,
        /// Byte budget (at least one batch is returned).
        max_bytes: u32,
        /// How long to wait at the end of the log for new data (ms).
        max_wait_ms: u32,
    },
    /// See [`Command::ListOffsets`].
    ListOffsets {
        /// Stream name.
        stream: &'a str,
        /// Topic name.
        topic: &'a str,
        /// Partition id.
        partition: u32,
        /// Which offset.
        spec: OffsetSpec,
    },
    /// See [`Command::JoinGroup`].
    JoinGroup {
        /// Stream name.
        stream: &'a str,
        /// Group name.
        group: &'a str,
        /// The topic the group consumes.
        topic: &'a str,
        /// A name for people (client id); need not be unique.
        member_name: &'a str,
        /// A member that sends no heartbeat for this long is removed (ms).
        session_timeout_ms: u32,
        /// The client session the member belongs to: it leaves its group when the
        /// session ends (0: none). A trailing field, absent from older clients.
        session: u64,
    },
    /// See [`Command::Heartbeat`].
    Heartbeat {
        /// The member.
        member: GroupMemberRequest<'a>,
        /// Partitions the member still owns (it has released all others).
        owned: Vec<u32>,
    },
    /// See [`Command::LeaveGroup`].
    LeaveGroup {
        /// Stream name.
        stream: &'a str,
        /// Group name.
        group: &'a str,
        /// The member.
        member_id: u64,
    },
    /// See [`Command::CommitOffsets`].
    CommitOffsets {
        /// The member.
        member: GroupMemberRequest<'a>,
        /// (partition, next offset to consume).
        offsets: Vec<(u32, u64)>,
    },
    /// See [`Command::FetchOffsets`].
    FetchOffsets {
        /// Stream name.
        stream: &'a str,
        /// Group name.
        group: &'a str,
    },
    /// See [`Command::ListGroups`].
    ListGroups {
        /// Stream name.
        stream: &'a str,
    },
    /// See [`Command::DescribeGroup`].
    DescribeGroup {
        /// Stream name.
        stream: &'a str,
        /// Group name.
        group: &'a str,
    },
}

/// A stream, topic or group name: the one place the name rule is checked (1 to 249
/// bytes of `a-z A-Z 0-9 - _ .`), so no request with a bad name reaches the node's
/// state. A name that breaks it is [`WireError::InvalidName`], which the node answers
/// with `InvalidArgument`, whatever is wrong with it.
fn name<'a>(reader: &mut WireReader<'a>, field: &'static str) -> Result<&'a str, WireError> {
    let at = reader.position();
    let value = reader.string(field)?;
    check_name(value, at, field)?;
    Ok(value)
}

/// A character that does not show as itself: controls (C0, C1, DEL), the format
/// characters that reorder or hide text (zero-width, direction marks and overrides,
/// invisible operators, the byte-order mark) and the line and paragraph separators.
fn hides_in_text(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{061C}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
        )
}

/// The name rule of [`name`], for a string read at `at`.
pub(crate) fn check_name(value: &str, at: usize, field: &'static str) -> Result<(), WireError> {
    let reason = if value.is_empty() {
        Some("empty")
    } else if value.len() > NAME_BYTES_MAX {
        Some("longer than 249 bytes")
    } else if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        Some("a character outside a-z A-Z 0-9 - _ .")
    } else if value.bytes().all(|b| b == b'.') {
        // `.` and `..` mean something to every tool that turns a name into a path.
        Some("dots alone")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(WireError::InvalidName { at, field, reason }),
        None => Ok(()),
    }
}

/// A SCRAM key field: exactly [`crate::scram::KEY_BYTES`] bytes.
/// A user's name and SCRAM credential (`CreateUser`, `ChangePassword`), each field in
/// its range: the salt goes out in every login's answer, and the iterations are what a
/// client pays at each login.
#[allow(clippy::type_complexity)]
fn credential<'a>(
    r: &mut WireReader<'a>,
) -> Result<(&'a str, &'a [u8], u32, &'a [u8], &'a [u8]), WireError> {
    use crate::scram::{ITERATIONS_MAX, ITERATIONS_MIN, SALT_BYTES_MAX};
    let name = name(r, "user")?;
    let at = r.position();
    let salt = r.bytes("salt")?;
    if salt.is_empty() || salt.len() > SALT_BYTES_MAX {
        return Err(WireError::OutOfRange {
            at,
            field: "salt length",
            value: salt.len() as u64,
            range: "1..=64",
        });
    }
    let at = r.position();
    let iterations = r.u32("iterations")?;
    if !(ITERATIONS_MIN..=ITERATIONS_MAX).contains(&iterations) {
        return Err(WireError::OutOfRange {
            at,
            field: "iterations",
            value: iterations.into(),
            range: "4096..=10000000",
        });
    }
    Ok((
        name,
        salt,
        iterations,
        key(r, "stored_key")?,
        key(r, "server_key")?,
    ))
}

fn key<'a>(reader: &mut WireReader<'a>, field: &'static str) -> Result<&'a [u8], WireError> {
    let at = reader.position();
    let value = reader.bytes(field)?;
    if value.len() != crate::scram::KEY_BYTES {
        return Err(WireError::BadValue {
            at,
            field,
            value: value.len() as u64,
        });
    }
    Ok(value)
}

fn member<'a>(reader: &mut WireReader<'a>) -> Result<GroupMemberRequest<'a>, WireError> {
    Ok(GroupMemberRequest {
        stream: name(reader, "stream")?,
        group: name(reader, "group")?,
        member_id: reader.u64("member_id")?,
        generation: reader.u32("generation")?,
    })
}

fn put_member(out: &mut Vec<u8>, member: &GroupMemberRequest<'_>) {
    out.put_string(member.stream);
    out.put_string(member.group);
    out.put_u64_be(member.member_id);
    out.put_u32_be(member.generation);
}

impl<'a> Request<'a> {
    /// The command of this request.
    pub fn command(&self) -> Command {
        match self {
            Self::Ping => Command::Ping,
            Self::Authenticate { .. } => Command::Authenticate,
            Self::CreateUser { .. } => Command::CreateUser,
            Self::ChangePassword { .. } => Command::ChangePassword,
            Self::DeleteUser { .. } => Command::DeleteUser,
            Self::ListUsers => Command::ListUsers,
            Self::ClusterInfo => Command::ClusterInfo,
            Self::NodeStatus => Command::NodeStatus,
            Self::RegisterSession { .. } => Command::RegisterSession,
            Self::EndSession { .. } => Command::EndSession,
            Self::SessionHeartbeat { .. } => Command::SessionHeartbeat,
            Self::GrantPermissions { .. } => Command::GrantPermissions,
            Self::RevokePermissions { .. } => Command::RevokePermissions,
            Self::CreateStream { .. } => Command::CreateStream,
            Self::DeleteStream { .. } => Command::DeleteStream,
            Self::ListStreams => Command::ListStreams,
            Self::CreateTopic { .. } => Command::CreateTopic,
            Self::DeleteTopic { .. } => Command::DeleteTopic,
            Self::ListTopics { .. } => Command::ListTopics,
            Self::DescribeTopic { .. } => Command::DescribeTopic,
            Self::Produce { .. } => Command::Produce,
            Self::Fetch { .. } => Command::Fetch,
            Self::ListOffsets { .. } => Command::ListOffsets,
            Self::JoinGroup { .. } => Command::JoinGroup,
            Self::Heartbeat { .. } => Command::Heartbeat,
            Self::LeaveGroup { .. } => Command::LeaveGroup,
            Self::CommitOffsets { .. } => Command::CommitOffsets,
            Self::FetchOffsets { .. } => Command::FetchOffsets,
            Self::ListGroups { .. } => Command::ListGroups,
            Self::DescribeGroup { .. } => Command::DescribeGroup,
        }
    }

    /// Appends the whole frame (header and body).
    pub fn encode(&self, request_id: u64, out: &mut Vec<u8>) {
        let start = super::begin_request(out, request_id, self.command());
        self.encode_body(out);
        super::finish_frame(out, start);
    }

    fn encode_body(&self, out: &mut Vec<u8>) {
        match self {
            Self::Ping
            | Self::ListStreams
            | Self::ListUsers
            | Self::ClusterInfo
            | Self::NodeStatus => {}
            Self::RegisterSession { timeout_ms } => out.put_u32_be(*timeout_ms),
            Self::EndSession { session } | Self::SessionHeartbeat { session } => {
                out.put_u64_be(*session);
            }
            Self::Authenticate { mechanism, message } => {
                out.put_string(mechanism);
                out.put_bytes(message);
            }
            Self::CreateUser {
                name,
                salt,
                iterations,
                stored_key,
                server_key,
            }
            | Self::ChangePassword {
                name,
                salt,
                iterations,
                stored_key,
                server_key,
            } => {
                out.put_string(name);
                out.put_bytes(salt);
                out.put_u32_be(*iterations);
                out.put_bytes(stored_key);
                out.put_bytes(server_key);
            }
            Self::DeleteUser { name } => out.put_string(name),
            Self::GrantPermissions { user, grant } | Self::RevokePermissions { user, grant } => {
                out.put_string(user);
                grant.encode_into(out);
            }
            Self::CreateStream { name } | Self::DeleteStream { name } => out.put_string(name),
            Self::CreateTopic {
                stream,
                topic,
                settings,
            } => {
                out.put_string(stream);
                out.put_string(topic);
                settings.encode_into(out);
            }
            Self::DeleteTopic { stream, topic } | Self::DescribeTopic { stream, topic } => {
                out.put_string(stream);
                out.put_string(topic);
            }
            Self::ListTopics { stream } | Self::ListGroups { stream } => out.put_string(stream),
            Self::Produce {
                stream,
                topic,
                partition,
                batch,
            } => {
                out.put_string(stream);
                out.put_string(topic);
                out.put_u32_be(*partition);
                out.put_bytes(batch);
            }
            Self::Fetch {
                stream,
                topic,
                partition,
                offset,
                max_bytes,
                max_wait_ms,
            } => {
                out.put_string(stream);
                out.put_string(topic);
                out.put_u32_be(*partition);
                out.put_u64_be(*offset);
                out.put_u32_be(*max_bytes);
                out.put_u32_be(*max_wait_ms);
            }
            Self::ListOffsets {
                stream,
                topic,
                partition,
                spec,
            } => {
                out.put_string(stream);
                out.put_string(topic);
                out.put_u32_be(*partition);
                let (kind, timestamp) = match spec {
                    OffsetSpec::Earliest => (0, 0),
                    OffsetSpec::Latest => (1, 0),
                    OffsetSpec::Timestamp(t) => (2, *t),
                };
                out.put_u8_be(kind);
                out.put_i64_be(timestamp);
            }
            Self::JoinGroup {
                stream,
                group,
                topic,
                member_name,
                session_timeout_ms,
                session,
            } => {
                out.put_string(stream);
                out.put_string(group);
                out.put_string(topic);
                out.put_string(member_name);
                out.put_u32_be(*session_timeout_ms);
                if *session != 0 {
                    out.put_u64_be(*session);
                }
            }
            Self::Heartbeat { member, owned } => {
                put_member(out, member);
                out.put_u32_be(owned.len() as u32);
                for partition in owned {
                    out.put_u32_be(*partition);
                }
            }
            Self::LeaveGroup {
                stream,
                group,
                member_id,
            } => {
                out.put_string(stream);
                out.put_string(group);
                out.put_u64_be(*member_id);
            }
            Self::CommitOffsets { member, offsets } => {
                put_member(out, member);
                out.put_u32_be(offsets.len() as u32);
                for (partition, offset) in offsets {
                    out.put_u32_be(*partition);
                    out.put_u64_be(*offset);
                }
            }
            Self::FetchOffsets { stream, group } | Self::DescribeGroup { stream, group } => {
                out.put_string(stream);
                out.put_string(group);
            }
        }
    }

    /// Decodes the body of a request with a known command. Strict: every field must be
    /// in range and no byte may be left over.
    ///
    /// # Errors
    /// A [`WireError`] with the byte offset in the body.
    pub fn decode(command: Command, body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = WireReader::new(body);
        let request = match command {
            Command::Ping => Self::Ping,
            Command::ListStreams => Self::ListStreams,
            Command::ListUsers => Self::ListUsers,
            Command::ClusterInfo => Self::ClusterInfo,
            Command::NodeStatus => Self::NodeStatus,
            Command::RegisterSession => Self::RegisterSession {
                timeout_ms: r.u32("timeout_ms")?,
            },
            Command::EndSession => Self::EndSession {
                session: r.u64("session")?,
            },
            Command::SessionHeartbeat => Self::SessionHeartbeat {
                session: r.u64("session")?,
            },
            Command::Authenticate => Self::Authenticate {
                mechanism: r.string("mechanism")?,
                message: r.bytes("message")?,
            },
            Command::CreateUser => {
                let (name, salt, iterations, stored_key, server_key) = credential(&mut r)?;
                Self::CreateUser {
                    name,
                    salt,
                    iterations,
                    stored_key,
                    server_key,
                }
            }
            Command::ChangePassword => {
                let (name, salt, iterations, stored_key, server_key) = credential(&mut r)?;
                Self::ChangePassword {
                    name,
                    salt,
                    iterations,
                    stored_key,
                    server_key,
                }
            }
            Command::DeleteUser => Self::DeleteUser {
                name: name(&mut r, "user")?,
            },
            Command::GrantPermissions => Self::GrantPermissions {
                user: name(&mut r, "user")?,
                grant: super::Grant::decode(&mut r)?,
            },
            Command::RevokePermissions => Self::RevokePermissions {
                user: name(&mut r, "user")?,
                grant: super::Grant::decode(&mut r)?,
            },
            Command::CreateStream => Self::CreateStream {
                name: name(&mut r, "stream")?,
            },
            Command::DeleteStream => Self::DeleteStream {
                name: name(&mut r, "stream")?,
            },
            Command::CreateTopic => Self::CreateTopic {
                stream: name(&mut r, "stream")?,
                topic: name(&mut r, "topic")?,
                settings: TopicSettings::decode_checked(&mut r)?,
            },
            Command::DeleteTopic => Self::DeleteTopic {
                stream: name(&mut r, "stream")?,
                topic: name(&mut r, "topic")?,
            },
            Command::ListTopics => Self::ListTopics {
                stream: name(&mut r, "stream")?,
            },
            Command::DescribeTopic => Self::DescribeTopic {
                stream: name(&mut r, "stream")?,
                topic: name(&mut r, "topic")?,
            },
            Command::Produce => Self::Produce {
                stream: name(&mut r, "stream")?,
                topic: name(&mut r, "topic")?,
                partition: r.u32("partition")?,
                batch: r.bytes("batch")?,
            },
            Command::Fetch => Self::Fetch {
                stream: name(&mut r, "stream")?,
                topic: name(&mut r, "topic")?,
                partition: r.u32("partition")?,
                offset: r.u64("offset")?,
                max_bytes: r.u32("max_bytes")?,
                max_wait_ms: r.u32("max_wait_ms")?,
            },
            Command::ListOffsets => {
                let stream = name(&mut r, "stream")?;
                let topic = name(&mut r, "topic")?;
                let partition = r.u32("partition")?;
                let at = r.position();
                let kind = r.u8("kind")?;
                let timestamp = r.i64("timestamp")?;
                // Kinds 0 and 1 carry timestamp 0, so every request has one encoding.
                let spec = match (kind, timestamp) {
                    (0, 0) => OffsetSpec::Earliest,
                    (1, 0) => OffsetSpec::Latest,
                    (2, _) => OffsetSpec::Timestamp(timestamp),
                    (other, _) => {
                        return Err(WireError::BadValue {
                            at,
                            field: "kind",
                            value: other.into(),
                        })
                    }
                };
                Self::ListOffsets {
                    stream,
                    topic,
                    partition,
                    spec,
                }
            }
            Command::JoinGroup => Self::JoinGroup {
                stream: name(&mut r, "stream")?,
                group: name(&mut r, "group")?,
                topic: name(&mut r, "topic")?,
                member_name: {
                    let at = r.position();
                    let member_name = r.string("member_name")?;
                    if member_name.len() > MEMBER_NAME_BYTES_MAX {
                        return Err(WireError::OutOfRange {
                            at,
                            field: "member_name length",
                            value: member_name.len() as u64,
                            range: "0..=255",
                        });
                    }
                    // Shown by `braid group describe` and logged: no escape sequences,
                    // and nothing invisible that could disguise a name.
                    if member_name.chars().any(hides_in_text) {
                        return Err(WireError::InvalidName {
                            at,
                            field: "member_name",
                            reason: "a control, format or separator character",
                        });
                    }
                    member_name
                },
                session_timeout_ms: r.u32("session_timeout_ms")?,
                session: if r.remaining() > 0 {
                    r.u64("session")?
                } else {
                    0
                },
            },
            Command::Heartbeat => {
                let member = member(&mut r)?;
                let count = r.count("owned", 4)?;
                let mut owned = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    owned.push(r.u32("owned")?);
                }
                Self::Heartbeat { member, owned }
            }
            Command::LeaveGroup => Self::LeaveGroup {
                stream: name(&mut r, "stream")?,
                group: name(&mut r, "group")?,
                member_id: r.u64("member_id")?,
            },
            Command::CommitOffsets => {
                let member = member(&mut r)?;
                let count = r.count("offsets", 12)?;
                let mut offsets = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    offsets.push((r.u32("partition")?, r.u64("offset")?));
                }
                Self::CommitOffsets { member, offsets }
            }
            Command::FetchOffsets => Self::FetchOffsets {
                stream: name(&mut r, "stream")?,
                group: name(&mut r, "group")?,
            },
            Command::ListGroups => Self::ListGroups {
                stream: name(&mut r, "stream")?,
            },
            Command::DescribeGroup => Self::DescribeGroup {
                stream: name(&mut r, "stream")?,
                group: name(&mut r, "group")?,
            },
        };
        r.finish()?;
        Ok(request)
    }
}
