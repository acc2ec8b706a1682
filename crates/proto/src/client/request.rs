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

/// Settings of a new topic. Zero in a size or time field means "the node's default"
/// (retention: keep forever).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TopicSettings {
    /// Number of partitions, at least 1.
    pub partitions: u32,
    /// [`FSYNC_DEFAULT`], [`FSYNC_ALWAYS`], [`FSYNC_INTERVAL`] or [`FSYNC_NEVER`].
    pub fsync: u8,
    /// Interval for [`FSYNC_INTERVAL`] (ms).
    pub fsync_interval_ms: u64,
    /// Retention by size per partition (bytes); 0: none.
    pub retention_bytes: u64,
    /// Retention by age (ms); 0: none.
    pub retention_ms: u64,
    /// Largest batch a producer may send (bytes); 0: the node's default.
    pub max_batch_bytes: u32,
    /// Log segment size (bytes); 0: the node's default.
    pub segment_bytes: u32,
}

impl TopicSettings {
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

    /// Reads the settings' wire form.
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
    } else {
        None
    };
    match reason {
        Some(reason) => Err(WireError::InvalidName { at, field, reason }),
        None => Ok(()),
    }
}

/// A SCRAM key field: exactly [`crate::scram::KEY_BYTES`] bytes.
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
            Self::DeleteUser { .. } => Command::DeleteUser,
            Self::ListUsers => Command::ListUsers,
            Self::ClusterInfo => Command::ClusterInfo,
            Self::NodeStatus => Command::NodeStatus,
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
            } => {
                out.put_string(stream);
                out.put_string(group);
                out.put_string(topic);
                out.put_string(member_name);
                out.put_u32_be(*session_timeout_ms);
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
            Command::Authenticate => Self::Authenticate {
                mechanism: r.string("mechanism")?,
                message: r.bytes("message")?,
            },
            Command::CreateUser => {
                let name = name(&mut r, "user")?;
                let salt = r.bytes("salt")?;
                let at = r.position();
                let iterations = r.u32("iterations")?;
                if iterations < crate::scram::ITERATIONS_MIN || salt.is_empty() {
                    return Err(WireError::BadValue {
                        at,
                        field: "iterations",
                        value: iterations.into(),
                    });
                }
                Self::CreateUser {
                    name,
                    salt,
                    iterations,
                    stored_key: key(&mut r, "stored_key")?,
                    server_key: key(&mut r, "server_key")?,
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
                settings: TopicSettings::decode(&mut r)?,
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
                member_name: r.string("member_name")?,
                session_timeout_ms: r.u32("session_timeout_ms")?,
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
