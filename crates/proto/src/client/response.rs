//! Response bodies.

use super::{Command, ErrorCode, TopicSettings};
use crate::wire::{WireError, WireReader, WireWrite};

/// A stream in [`Response::Streams`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSummary {
    /// Stream name.
    pub name: String,
    /// Number of topics.
    pub topics: u32,
}

/// A topic in [`Response::Topics`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSummary {
    /// Topic name.
    pub name: String,
    /// Number of partitions.
    pub partitions: u32,
}

/// A partition in [`TopicInfo`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionInfo {
    /// Partition id, unique within the topic.
    pub id: u32,
    /// First hash of its key range on the 16-bit ring.
    pub hash_start: u16,
    /// Last hash of its range (inclusive).
    pub hash_end: u16,
    /// Partitions it was split or merged from.
    pub parents: Vec<u32>,
    /// Sealed partitions take no more records.
    pub sealed: bool,
    /// Earliest offset stored.
    pub start_offset: u64,
    /// Offset after the last committed record.
    pub high_watermark: u64,
}

/// [`Response::Topic`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    /// Stream name.
    pub stream: String,
    /// Topic name.
    pub name: String,
    /// Topic id, unique in the node and never reused.
    pub id: u32,
    /// Grows with every change of the partition layout.
    pub epoch: u64,
    /// The settings in force (defaults filled in).
    pub settings: TopicSettings,
    /// Every partition, active and sealed.
    pub partitions: Vec<PartitionInfo>,
}

/// A committed offset in [`Response::Offsets`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionOffsets {
    /// Partition id.
    pub partition: u32,
    /// Next offset to consume, if the group committed one.
    pub committed: Option<u64>,
    /// Offset after the last committed record of the partition.
    pub high_watermark: u64,
}

/// A group in [`Response::Groups`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSummary {
    /// Group name.
    pub name: String,
    /// The topic it consumes.
    pub topic: String,
    /// Members now.
    pub members: u32,
    /// Current generation.
    pub generation: u32,
}

/// A member in [`GroupDescription`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    /// Member id.
    pub id: u64,
    /// The name it gave.
    pub name: String,
    /// Partitions assigned to it.
    pub assignment: Vec<u32>,
}

/// [`Response::Group`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    /// Group name.
    pub name: String,
    /// The topic it consumes.
    pub topic: String,
    /// Current generation.
    pub generation: u32,
    /// Members.
    pub members: Vec<GroupMember>,
    /// Committed offsets and high watermarks (lag = high watermark − committed).
    pub offsets: Vec<PartitionOffsets>,
}

/// The wire value of "no member" in [`ClusterInfo::coordinator`].
const NO_MEMBER: u8 = u8::MAX;

/// A member in [`ClusterInfo`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterMember {
    /// Its member id.
    pub id: u8,
    /// Where clients reach it (`HOST:PORT`).
    pub client_addr: String,
}

/// The primaries of one topic's partitions in [`ClusterInfo`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicPrimaries {
    /// Stream name.
    pub stream: String,
    /// Topic name.
    pub topic: String,
    /// Each partition's primary as the answering node knows it.
    pub partitions: Vec<PartitionPrimary>,
}

/// One partition's primary in [`ClusterInfo`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionPrimary {
    /// The partition id.
    pub partition: u32,
    /// The member leading it, if the answering node's replica is in normal status
    /// (it heard from the primary of its view); `None` while it changes view.
    pub primary: Option<u8>,
    /// The answering replica's view: of two answers, the newer view is right.
    pub view: u64,
}

/// [`Response::Cluster`]: who is in the cluster and who leads what, as the answering
/// node knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterInfo {
    /// The cluster's name.
    pub cluster_id: String,
    /// The member that answered.
    pub node_id: u8,
    /// The member that coordinates consumer groups (it leads the metadata group), if
    /// the answering node knows one; consumer-group calls go there.
    pub coordinator: Option<u8>,
    /// Every member.
    pub members: Vec<ClusterMember>,
    /// Each partition's primary, for the topics the caller may see.
    pub topics: Vec<TopicPrimaries>,
}

/// A successful response.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Response {
    /// No body: Ping, CreateStream, DeleteStream, CreateTopic, DeleteTopic, LeaveGroup,
    /// CommitOffsets.
    Empty,
    /// ListStreams.
    Streams(Vec<StreamSummary>),
    /// ListTopics.
    Topics(Vec<TopicSummary>),
    /// DescribeTopic.
    Topic(TopicInfo),
    /// Produce: the offsets the batch got.
    Produced {
        /// Offset of its first record.
        base_offset: u64,
        /// Offset of its last record.
        last_offset: u64,
    },
    /// Fetch.
    Fetched {
        /// Offset after the last committed record.
        high_watermark: u64,
        /// Earliest offset stored.
        start_offset: u64,
        /// Whole batches, as stored; empty if none. Shared with the frame they came
        /// in (see [`Response::decode_shared`]), so a large fetch is not copied.
        batches: bytes::Bytes,
    },
    /// ListOffsets; `None` when no record is at or after the timestamp.
    Offset(Option<u64>),
    /// JoinGroup and Heartbeat: the member's assignment.
    Assignment {
        /// The member id.
        member_id: u64,
        /// The group generation.
        generation: u32,
        /// Partitions the member may consume now.
        partitions: Vec<u32>,
    },
    /// FetchOffsets.
    Offsets(Vec<PartitionOffsets>),
    /// ListGroups.
    Groups(Vec<GroupSummary>),
    /// DescribeGroup.
    Group(GroupDescription),
    /// Authenticate: the server-first, then the server-final SCRAM message.
    Authenticated(Vec<u8>),
    /// ListUsers.
    Users(Vec<super::UserSummary>),
    /// ClusterInfo.
    Cluster(ClusterInfo),
    /// NodeStatus.
    Node(super::NodeStatus),
    /// RegisterSession: the new session's id.
    Session(u64),
    /// SessionHeartbeat: every ended session at or below this id is retired (the
    /// partitions forgot it); 0 while none is.
    SessionAlive {
        /// The retirement watermark.
        retired_through: u64,
    },
}

fn put_offsets(out: &mut Vec<u8>, offsets: &[PartitionOffsets]) {
    out.put_u32_be(offsets.len() as u32);
    for o in offsets {
        out.put_u32_be(o.partition);
        put_option(out, o.committed);
        out.put_u64_be(o.high_watermark);
    }
}

fn put_option(out: &mut Vec<u8>, value: Option<u64>) {
    match value {
        Some(v) => {
            out.put_u8_be(1);
            out.put_u64_be(v);
        }
        None => out.put_u8_be(0),
    }
}

fn option(r: &mut WireReader<'_>, field: &'static str) -> Result<Option<u64>, WireError> {
    Ok(if r.bool(field)? {
        Some(r.u64(field)?)
    } else {
        None
    })
}

fn u32_list(r: &mut WireReader<'_>, field: &'static str) -> Result<Vec<u32>, WireError> {
    let count = r.count(field, 4)?;
    (0..count).map(|_| r.u32(field)).collect()
}

fn put_u32_list(out: &mut Vec<u8>, values: &[u32]) {
    out.put_u32_be(values.len() as u32);
    for v in values {
        out.put_u32_be(*v);
    }
}

fn offsets(r: &mut WireReader<'_>) -> Result<Vec<PartitionOffsets>, WireError> {
    let count = r.count("offsets", 13)?;
    (0..count)
        .map(|_| {
            Ok(PartitionOffsets {
                partition: r.u32("partition")?,
                committed: option(r, "committed")?,
                high_watermark: r.u64("high_watermark")?,
            })
        })
        .collect()
}

fn string(r: &mut WireReader<'_>, field: &'static str) -> Result<String, WireError> {
    r.string(field).map(str::to_owned)
}

/// Appends the header and fixed fields of a Fetch response whose `batches_len` bytes of
/// batches the caller writes right after, so a node can send stored bytes without
/// copying them into the frame.
pub fn encode_fetch_prefix(
    out: &mut Vec<u8>,
    request_id: u64,
    high_watermark: u64,
    start_offset: u64,
    batches_len: u32,
) {
    let length =
        (super::RESPONSE_HEADER_BYTES - super::LENGTH_BYTES + 8 + 8 + 4) as u32 + batches_len;
    out.put_u32_be(length);
    out.put_u64_be(request_id);
    out.put_u16_be(Command::Fetch as u16);
    out.put_u16_be(0);
    out.put_u64_be(high_watermark);
    out.put_u64_be(start_offset);
    out.put_u32_be(batches_len);
}

impl Response {
    /// Appends a whole success frame.
    pub fn encode(&self, request_id: u64, command: Command, out: &mut Vec<u8>) {
        let start = super::begin_response(out, request_id, command as u16, 0);
        self.encode_body(out);
        super::finish_frame(out, start);
    }

    fn encode_body(&self, out: &mut Vec<u8>) {
        match self {
            Self::Empty => {}
            Self::Session(session) => out.put_u64_be(*session),
            Self::SessionAlive { retired_through } => out.put_u64_be(*retired_through),
            Self::Authenticated(message) => out.put_bytes(message),
            Self::Cluster(info) => {
                out.put_string(&info.cluster_id);
                out.put_u8_be(info.node_id);
                out.put_u8_be(info.coordinator.unwrap_or(NO_MEMBER));
                out.put_u32_be(info.members.len() as u32);
                for m in &info.members {
                    out.put_u8_be(m.id);
                    out.put_string(&m.client_addr);
                }
                out.put_u32_be(info.topics.len() as u32);
                for t in &info.topics {
                    out.put_string(&t.stream);
                    out.put_string(&t.topic);
                    out.put_u32_be(t.partitions.len() as u32);
                    for p in &t.partitions {
                        out.put_u32_be(p.partition);
                        out.put_u8_be(p.primary.unwrap_or(NO_MEMBER));
                        out.put_u64_be(p.view);
                    }
                }
            }
            Self::Node(status) => status.encode_into(out),
            Self::Users(users) => {
                out.put_u32_be(users.len() as u32);
                for user in users {
                    out.put_string(&user.name);
                    out.put_u32_be(user.grants.len() as u32);
                    for grant in &user.grants {
                        grant.encode_into(out);
                    }
                }
            }
            Self::Streams(streams) => {
                out.put_u32_be(streams.len() as u32);
                for s in streams {
                    out.put_string(&s.name);
                    out.put_u32_be(s.topics);
                }
            }
            Self::Topics(topics) => {
                out.put_u32_be(topics.len() as u32);
                for t in topics {
                    out.put_string(&t.name);
                    out.put_u32_be(t.partitions);
                }
            }
            Self::Topic(info) => {
                out.put_string(&info.stream);
                out.put_string(&info.name);
                out.put_u32_be(info.id);
                out.put_u64_be(info.epoch);
                info.settings.encode_into(out);
                out.put_u32_be(info.partitions.len() as u32);
                for p in &info.partitions {
                    out.put_u32_be(p.id);
                    out.put_u16_be(p.hash_start);
                    out.put_u16_be(p.hash_end);
                    put_u32_list(out, &p.parents);
                    out.put_u8_be(u8::from(p.sealed));
                    out.put_u64_be(p.start_offset);
                    out.put_u64_be(p.high_watermark);
                }
            }
            Self::Produced {
                base_offset,
                last_offset,
            } => {
                out.put_u64_be(*base_offset);
                out.put_u64_be(*last_offset);
            }
            Self::Fetched {
                high_watermark,
                start_offset,
                batches,
            } => {
                out.put_u64_be(*high_watermark);
                out.put_u64_be(*start_offset);
                out.put_bytes(batches);
            }
            Self::Offset(offset) => put_option(out, *offset),
            Self::Assignment {
                member_id,
                generation,
                partitions,
            } => {
                out.put_u64_be(*member_id);
                out.put_u32_be(*generation);
                put_u32_list(out, partitions);
            }
            Self::Offsets(list) => put_offsets(out, list),
            Self::Groups(groups) => {
                out.put_u32_be(groups.len() as u32);
                for g in groups {
                    out.put_string(&g.name);
                    out.put_string(&g.topic);
                    out.put_u32_be(g.members);
                    out.put_u32_be(g.generation);
                }
            }
            Self::Group(g) => {
                out.put_string(&g.name);
                out.put_string(&g.topic);
                out.put_u32_be(g.generation);
                out.put_u32_be(g.members.len() as u32);
                for m in &g.members {
                    out.put_u64_be(m.id);
                    out.put_string(&m.name);
                    put_u32_list(out, &m.assignment);
                }
                put_offsets(out, &g.offsets);
            }
        }
    }

    /// As [`Response::decode`], for a body held in shared bytes: a fetch's batches then
    /// point into `body` instead of being copied out of it.
    ///
    /// # Errors
    /// As [`Response::decode`].
    pub fn decode_shared(command: Command, body: &bytes::Bytes) -> Result<Self, WireError> {
        if command != Command::Fetch {
            return Self::decode(command, body);
        }
        let mut r = WireReader::new(body);
        let high_watermark = r.u64("high_watermark")?;
        let start_offset = r.u64("start_offset")?;
        let batches = body.slice_ref(r.bytes("batches")?);
        r.finish()?;
        Ok(Self::Fetched {
            high_watermark,
            start_offset,
            batches,
        })
    }

    /// Decodes the body of a successful response to `command`.
    ///
    /// # Errors
    /// A [`WireError`] with the byte offset in the body.
    pub fn decode(command: Command, body: &[u8]) -> Result<Self, WireError> {
        let mut r = WireReader::new(body);
        let response = match command {
            Command::Ping
            | Command::CreateStream
            | Command::DeleteStream
            | Command::CreateTopic
            | Command::DeleteTopic
            | Command::LeaveGroup
            | Command::CommitOffsets
            | Command::CreateUser
            | Command::ChangePassword
            | Command::DeleteUser
            | Command::GrantPermissions
            | Command::RevokePermissions
            | Command::EndSession => Self::Empty,
            Command::RegisterSession => Self::Session(r.u64("session")?),
            Command::SessionHeartbeat => Self::SessionAlive {
                retired_through: r.u64("retired_through")?,
            },
            Command::Authenticate => Self::Authenticated(r.bytes("message")?.to_vec()),
            Command::ClusterInfo => {
                let cluster_id = string(&mut r, "cluster_id")?;
                let node_id = r.u8("node_id")?;
                let coordinator = Some(r.u8("coordinator")?).filter(|m| *m != NO_MEMBER);
                let members = (0..r.count("members", 3)?)
                    .map(|_| {
                        Ok(ClusterMember {
                            id: r.u8("member")?,
                            client_addr: string(&mut r, "client_addr")?,
                        })
                    })
                    .collect::<Result<_, WireError>>()?;
                let topics = (0..r.count("topics", 8)?)
                    .map(|_| {
                        let stream = string(&mut r, "stream")?;
                        let topic = string(&mut r, "topic")?;
                        let partitions = (0..r.count("partitions", 13)?)
                            .map(|_| {
                                let partition = r.u32("partition")?;
                                let primary = r.u8("primary")?;
                                Ok(PartitionPrimary {
                                    partition,
                                    primary: (primary != NO_MEMBER).then_some(primary),
                                    view: r.u64("view")?,
                                })
                            })
                            .collect::<Result<_, WireError>>()?;
                        Ok(TopicPrimaries {
                            stream,
                            topic,
                            partitions,
                        })
                    })
                    .collect::<Result<_, WireError>>()?;
                Self::Cluster(ClusterInfo {
                    cluster_id,
                    node_id,
                    coordinator,
                    members,
                    topics,
                })
            }
            Command::NodeStatus => Self::Node(super::NodeStatus::decode(&mut r)?),
            Command::ListUsers => {
                let count = r.count("users", 6)?;
                let users = (0..count)
                    .map(|_| {
                        let name = string(&mut r, "user")?;
                        let grants = (0..r.count("grants", 4)?)
                            .map(|_| super::Grant::decode(&mut r))
                            .collect::<Result<_, WireError>>()?;
                        Ok(super::UserSummary { name, grants })
                    })
                    .collect::<Result<_, WireError>>()?;
                Self::Users(users)
            }
            Command::ListStreams => {
                let count = r.count("streams", 6)?;
                let list = (0..count)
                    .map(|_| {
                        Ok(StreamSummary {
                            name: string(&mut r, "name")?,
                            topics: r.u32("topics")?,
                        })
                    })
                    .collect::<Result<_, WireError>>()?;
                Self::Streams(list)
            }
            Command::ListTopics => {
                let count = r.count("topics", 6)?;
                let list = (0..count)
                    .map(|_| {
                        Ok(TopicSummary {
                            name: string(&mut r, "name")?,
                            partitions: r.u32("partitions")?,
                        })
                    })
                    .collect::<Result<_, WireError>>()?;
                Self::Topics(list)
            }
            Command::DescribeTopic => {
                let stream = string(&mut r, "stream")?;
                let name = string(&mut r, "name")?;
                let id = r.u32("id")?;
                let epoch = r.u64("epoch")?;
                let settings = TopicSettings::decode(&mut r)?;
                let count = r.count("partitions", 29)?;
                let partitions = (0..count)
                    .map(|_| {
                        Ok(PartitionInfo {
                            id: r.u32("id")?,
                            hash_start: r.u16("hash_start")?,
                            hash_end: r.u16("hash_end")?,
                            parents: u32_list(&mut r, "parents")?,
                            sealed: r.bool("sealed")?,
                            start_offset: r.u64("start_offset")?,
                            high_watermark: r.u64("high_watermark")?,
                        })
                    })
                    .collect::<Result<_, WireError>>()?;
                Self::Topic(TopicInfo {
                    stream,
                    name,
                    id,
                    epoch,
                    settings,
                    partitions,
                })
            }
            Command::Produce => Self::Produced {
                base_offset: r.u64("base_offset")?,
                last_offset: r.u64("last_offset")?,
            },
            Command::Fetch => Self::Fetched {
                high_watermark: r.u64("high_watermark")?,
                start_offset: r.u64("start_offset")?,
                batches: bytes::Bytes::copy_from_slice(r.bytes("batches")?),
            },
            Command::ListOffsets => Self::Offset(option(&mut r, "offset")?),
            Command::JoinGroup | Command::Heartbeat => Self::Assignment {
                member_id: r.u64("member_id")?,
                generation: r.u32("generation")?,
                partitions: u32_list(&mut r, "partitions")?,
            },
            Command::FetchOffsets => Self::Offsets(offsets(&mut r)?),
            Command::ListGroups => {
                let count = r.count("groups", 12)?;
                let list = (0..count)
                    .map(|_| {
                        Ok(GroupSummary {
                            name: string(&mut r, "name")?,
                            topic: string(&mut r, "topic")?,
                            members: r.u32("members")?,
                            generation: r.u32("generation")?,
                        })
                    })
                    .collect::<Result<_, WireError>>()?;
                Self::Groups(list)
            }
            Command::DescribeGroup => {
                let name = string(&mut r, "name")?;
                let topic = string(&mut r, "topic")?;
                let generation = r.u32("generation")?;
                let count = r.count("members", 14)?;
                let members = (0..count)
                    .map(|_| {
                        Ok(GroupMember {
                            id: r.u64("id")?,
                            name: string(&mut r, "name")?,
                            assignment: u32_list(&mut r, "assignment")?,
                        })
                    })
                    .collect::<Result<_, WireError>>()?;
                Self::Group(GroupDescription {
                    name,
                    topic,
                    generation,
                    members,
                    offsets: offsets(&mut r)?,
                })
            }
        };
        r.finish()?;
        Ok(response)
    }
}

/// Decodes the message of an error response (its details skipped; see
/// [`super::ErrorBody`] for them).
///
/// # Errors
/// A [`WireError`] if the body does not decode.
pub fn decode_error_message(body: &[u8]) -> Result<String, WireError> {
    super::ErrorBody::decode(body).map(|body| body.message)
}

/// The [`ErrorCode`] of a status, or [`ErrorCode::Internal`] for a number this client
/// does not know (a newer node).
pub fn error_code(status: u16) -> ErrorCode {
    ErrorCode::from_u16(status).unwrap_or(ErrorCode::Internal)
}
