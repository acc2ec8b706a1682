//! The node's metadata: streams, topics with their partition layout, and the committed
//! offsets of consumer groups. A pure state machine: [`Metadata::apply`] takes a
//! [`MetaOp`] and changes the state deterministically, so replaying the durable op log
//! (see `meta_store`) rebuilds the same state, ids included. It is shaped to become the
//! metadata group's replicated state machine.

use std::collections::BTreeMap;

use braid_proto::client::{Grant, Resource, TopicSettings, NAME_BYTES_MAX, USERS};
use braid_proto::scram::ScramCredential;
use braid_proto::wire::{WireError, WireReader, WireWrite};

pub mod members;
pub mod op;
pub mod retirement;
pub mod sessions;
pub use op::MetaOp;
pub use retirement::{PartitionRef, RetireReport, Retirement};
pub use sessions::ClientSession;

/// Most partitions a topic may be created with (the protocol's range, also checked
/// when a CreateTopic request is decoded).
pub const TOPIC_PARTITIONS_MAX: u32 = braid_proto::client::TOPIC_PARTITIONS_MAX;

/// One partition of a topic's layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMeta {
    /// Id within the topic.
    pub id: u32,
    /// First hash of its range.
    pub hash_start: u16,
    /// Last hash of its range (inclusive).
    pub hash_end: u16,
    /// Partitions it came from (split or merge).
    pub parents: Vec<u32>,
    /// No more appends.
    pub sealed: bool,
    /// The metadata op that created it (0 in metadata written before it was kept):
    /// no client session that ended at or below it can reach it, so the retirement of
    /// ended sessions skips it (`docs/architecture.md`).
    pub created_op: u64,
}

/// A topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicMeta {
    /// Node-wide unique id, never reused.
    pub id: u32,
    /// Settings with the node's defaults filled in.
    pub settings: TopicSettings,
    /// Grows with every layout change.
    pub epoch: u64,
    /// Every partition, active and sealed.
    pub partitions: Vec<PartitionMeta>,
}

/// The durable part of a consumer group: its topic and committed offsets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupMeta {
    /// The topic the group consumes.
    pub topic: String,
    /// Partition id to the next offset to consume.
    pub offsets: BTreeMap<u32, u64>,
}

/// A stream: a namespace of topics and groups.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamMeta {
    /// Node-wide unique id.
    pub id: u32,
    /// Topics by name.
    pub topics: BTreeMap<String, TopicMeta>,
    /// Groups by name.
    pub groups: BTreeMap<String, GroupMeta>,
}

/// A user: its SCRAM credential and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserMeta {
    /// What the node checks a login against (no password is stored).
    pub credential: ScramCredential,
    /// Permission bits per resource.
    pub grants: BTreeMap<Resource, u8>,
}

/// All metadata of a node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Metadata {
    next_stream_id: u32,
    next_topic_id: u32,
    /// Streams by name.
    pub streams: BTreeMap<String, StreamMeta>,
    /// Users by name, with their grants.
    pub users: BTreeMap<String, UserMeta>,
    /// The op being applied (the last applied after it): what a session's id is.
    applied_op: u64,
    /// Client sessions by id, open or ended, until retired.
    pub sessions: BTreeMap<u64, ClientSession>,
    /// The retirement of ended sessions: reports, what is retired, debts.
    pub retirement: Retirement,
    /// Consumer groups' members and assignments.
    pub memberships: members::Memberships,
    /// Which groups each client session's members may be in (a lookup).
    session_groups: members::SessionGroups,
    /// The user each owned client session belongs to, by session id.
    pub session_owners: BTreeMap<u64, String>,
}

/// A part of the metadata an op changed, as the layout and the access table see it:
/// each is read again from the metadata after the op, so applying a change to a
/// layout costs what changed, not what exists.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Touch {
    /// A stream was created or deleted (with its topics).
    Stream(String),
    /// A topic was created or deleted.
    Topic {
        /// Its stream.
        stream: String,
        /// Its name.
        topic: String,
    },
    /// A user was created or deleted, or its credential or grants changed.
    User(String),
    /// A client session was registered, ended or retired.
    Session(u64),
    /// The partitions that owe a retirement changed.
    Debts,
}

/// Why an op was refused. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MetaError {
    /// No such stream.
    #[error("stream {0:?} does not exist")]
    StreamNotFound(String),
    /// The stream exists.
    #[error("stream {0:?} already exists")]
    StreamExists(String),
    /// No such topic.
    #[error("topic {stream:?}/{topic:?} does not exist")]
    TopicNotFound {
        /// The stream.
        stream: String,
        /// The topic.
        topic: String,
    },
    /// The topic exists.
    #[error("topic {stream:?}/{topic:?} already exists")]
    TopicExists {
        /// The stream.
        stream: String,
        /// The topic.
        topic: String,
    },
    /// No such user.
    #[error("user {0:?} does not exist")]
    UserNotFound(String),
    /// The user exists.
    #[error("user {0:?} already exists")]
    UserExists(String),
    /// No such client session (never registered, or retired).
    #[error("client session {0} does not exist (never registered, or ended and retired)")]
    SessionNotFound(u64),
    /// An argument is out of range.
    #[error("{0}")]
    Invalid(String),
    /// A consumer-group change the group's membership refuses.
    #[error(transparent)]
    Group(#[from] crate::groups::GroupError),
}

fn check_name(kind: &str, name: &str) -> Result<(), MetaError> {
    let ok = !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(MetaError::Invalid(format!(
            "{kind} name {name:?} must be 1 to {NAME_BYTES_MAX} characters of a-z, A-Z, 0-9, '-', '_', '.'"
        )))
    }
}

impl Metadata {
    /// The stream named `name`.
    ///
    /// # Errors
    /// [`MetaError::StreamNotFound`].
    pub fn stream(&self, name: &str) -> Result<&StreamMeta, MetaError> {
        self.streams
            .get(name)
            .ok_or_else(|| MetaError::StreamNotFound(name.to_owned()))
    }

    /// The topic `stream/topic`.
    ///
    /// # Errors
    /// [`MetaError::StreamNotFound`], [`MetaError::TopicNotFound`].
    pub fn topic(&self, stream: &str, topic: &str) -> Result<&TopicMeta, MetaError> {
        self.stream(stream)?
            .topics
            .get(topic)
            .ok_or_else(|| MetaError::TopicNotFound {
                stream: stream.to_owned(),
                topic: topic.to_owned(),
            })
    }

    /// Checks an op without applying it.
    ///
    /// # Errors
    /// The [`MetaError`] that [`Metadata::apply`] would return.
    pub fn check(&self, op: &MetaOp) -> Result<(), MetaError> {
        op.check(self)
    }

    /// Starts applying metadata log op `op` (a batch of [`MetaOp`]s): a session
    /// registered by it gets its number.
    pub fn begin_op(&mut self, op: u64) {
        self.applied_op = op;
    }

    /// The metadata log op applied last (or being applied).
    pub fn applied_op(&self) -> u64 {
        self.applied_op
    }

    /// Applies an op.
    ///
    /// # Errors
    /// A [`MetaError`]; the state is then unchanged.
    pub fn apply(&mut self, op: &MetaOp) -> Result<(), MetaError> {
        op.check(self)?;
        op.apply_checked(self);
        Ok(())
    }

    /// What applying `op` touches, in the terms the layout and the access table are
    /// built from; asked before the op is applied (a deleted stream's grants are gone
    /// after). An op that changes neither (an offset commit, the topic id floor)
    /// touches nothing.
    pub fn touches(&self, op: &MetaOp) -> Vec<Touch> {
        op.touches(self)
    }

    /// Refuses taking `bits` of the node's permissions from `user` (or the user, for
    /// `USERS`) if that would leave no user able to manage users: nobody could then
    /// fix the grants without editing the data directory.
    fn keeps_a_user_manager(&self, user: &str, bits: u8) -> Result<(), MetaError> {
        let manages = |u: &UserMeta| {
            u.grants
                .get(&Resource::Node)
                .is_some_and(|b| b & USERS != 0)
        };
        let target = self.user(user)?;
        let others = self
            .users
            .iter()
            .any(|(name, u)| name != user && manages(u));
        if bits & USERS != 0 && manages(target) && !others {
            return Err(MetaError::Invalid(format!(
                "user {user} is the last one with the users permission; grant it to another user first"
            )));
        }
        Ok(())
    }

    /// The user named `name`.
    ///
    /// # Errors
    /// [`MetaError::UserNotFound`].
    pub fn user(&self, name: &str) -> Result<&UserMeta, MetaError> {
        self.users
            .get(name)
            .ok_or_else(|| MetaError::UserNotFound(name.to_owned()))
    }

    /// The id the next topic gets.
    pub fn next_topic_id(&self) -> u32 {
        self.next_topic_id
    }

    /// Every topic as `(stream, topic name, meta)`.
    pub fn topics(&self) -> impl Iterator<Item = (&str, &str, &TopicMeta)> {
        self.streams.iter().flat_map(|(stream, s)| {
            s.topics
                .iter()
                .map(move |(name, t)| (stream.as_str(), name.as_str(), t))
        })
    }
}

/// A credential's salt and iterations in their ranges (as the wire checks them): the
/// salt goes out in every login's answer, the iterations are each login's cost.
fn check_credential(credential: &ScramCredential) -> Result<(), MetaError> {
    use braid_proto::scram::{ITERATIONS_MAX, ITERATIONS_MIN, SALT_BYTES_MAX};
    if credential.salt.is_empty()
        || credential.salt.len() > SALT_BYTES_MAX
        || !(ITERATIONS_MIN..=ITERATIONS_MAX).contains(&credential.iterations)
    {
        return Err(MetaError::Invalid(format!(
            "a credential needs 1 to {SALT_BYTES_MAX} bytes of salt and \
             {ITERATIONS_MIN} to {ITERATIONS_MAX} iterations"
        )));
    }
    Ok(())
}

fn put_credential(out: &mut Vec<u8>, credential: &ScramCredential) {
    out.put_bytes(&credential.salt);
    out.put_u32_be(credential.iterations);
    out.extend_from_slice(&credential.stored_key);
    out.extend_from_slice(&credential.server_key);
}

fn credential(r: &mut WireReader<'_>) -> Result<ScramCredential, WireError> {
    let salt = r.bytes("salt")?.to_vec();
    let iterations = r.u32("iterations")?;
    let mut key = |field| -> Result<[u8; 32], WireError> {
        let bytes = r.take(32, field)?;
        let mut out = [0u8; 32];
        out.copy_from_slice(bytes);
        Ok(out)
    };
    Ok(ScramCredential {
        salt,
        iterations,
        stored_key: key("stored_key")?,
        server_key: key("server_key")?,
    })
}

fn decode_settings(r: &mut WireReader<'_>) -> Result<TopicSettings, WireError> {
    TopicSettings::decode(r)
}

impl Metadata {
    /// Encodes the whole state (for a snapshot).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u32_be(self.next_stream_id);
        out.put_u32_be(self.next_topic_id);
        out.put_u32_be(self.streams.len() as u32);
        for (name, stream) in &self.streams {
            out.put_string(name);
            out.put_u32_be(stream.id);
            out.put_u32_be(stream.topics.len() as u32);
            for (topic_name, topic) in &stream.topics {
                out.put_string(topic_name);
                out.put_u32_be(topic.id);
                topic.settings.encode_into(out);
                out.put_u64_be(topic.epoch);
                out.put_u32_be(topic.partitions.len() as u32);
                for p in &topic.partitions {
                    out.put_u32_be(p.id);
                    out.put_u16_be(p.hash_start);
                    out.put_u16_be(p.hash_end);
                    out.put_u32_be(p.parents.len() as u32);
                    for parent in &p.parents {
                        out.put_u32_be(*parent);
                    }
                    out.put_u8_be(u8::from(p.sealed));
                }
            }
            out.put_u32_be(stream.groups.len() as u32);
            for (group_name, group) in &stream.groups {
                out.put_string(group_name);
                out.put_string(&group.topic);
                out.put_u32_be(group.offsets.len() as u32);
                for (p, o) in &group.offsets {
                    out.put_u32_be(*p);
                    out.put_u64_be(*o);
                }
            }
        }
        // Users came after streams in the format; a snapshot without them has none.
        out.put_u32_be(self.users.len() as u32);
        for (name, user) in &self.users {
            out.put_string(name);
            put_credential(out, &user.credential);
            out.put_u32_be(user.grants.len() as u32);
            for (resource, permissions) in &user.grants {
                let grant = Grant {
                    resource: resource.clone(),
                    permissions: *permissions,
                };
                grant.encode_into(out);
            }
        }
        // Sessions came after users; a snapshot without them has none.
        sessions::encode(self.applied_op, &self.sessions, out);
        // Retirement came after sessions; a snapshot without it retired nothing.
        self.retirement.encode(out);
        // Create ops came after retirement; a snapshot without them has 0 for each.
        self.encode_created(out);
        // Memberships came after create ops; a snapshot without them has no members.
        members::encode(&self.memberships, out);
        // Session owners came after memberships; a snapshot without them has none.
        sessions::encode_owners(&self.session_owners, out);
    }

    /// The partitions' create ops: `count: u32`, then `topic_id: u32, partition:
    /// u32, created_op: u64` for each partition whose op is not 0.
    fn encode_created(&self, out: &mut Vec<u8>) {
        let created: Vec<(u32, u32, u64)> = self
            .streams
            .values()
            .flat_map(|s| s.topics.values())
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .filter(|p| p.created_op != 0)
                    .map(|p| (t.id, p.id, p.created_op))
            })
            .collect();
        out.put_u32_be(created.len() as u32);
        for (topic, partition, op) in created {
            out.put_u32_be(topic);
            out.put_u32_be(partition);
            out.put_u64_be(op);
        }
    }

    fn decode_created(&mut self, r: &mut WireReader<'_>) -> Result<(), WireError> {
        let mut partitions: BTreeMap<(u32, u32), &mut PartitionMeta> = self
            .streams
            .values_mut()
            .flat_map(|s| s.topics.values_mut())
            .flat_map(|t| {
                let topic = t.id;
                t.partitions.iter_mut().map(move |p| ((topic, p.id), p))
            })
            .collect();
        for _ in 0..r.count("created", 16)? {
            let at = r.position();
            let key = (r.u32("topic_id")?, r.u32("partition")?);
            let op = r.u64("created_op")?;
            match partitions.get_mut(&key) {
                Some(partition) => partition.created_op = op,
                None => {
                    return Err(WireError::BadValue {
                        at,
                        field: "created_op's partition",
                        value: u64::from(key.0) << 32 | u64::from(key.1),
                    })
                }
            }
        }
        Ok(())
    }

    /// Decodes a state written by [`Metadata::encode`].
    ///
    /// # Errors
    /// A [`WireError`].
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut r = WireReader::new(bytes);
        let mut meta = Self {
            next_stream_id: r.u32("next_stream_id")?,
            next_topic_id: r.u32("next_topic_id")?,
            streams: BTreeMap::new(),
            users: BTreeMap::new(),
            applied_op: 0,
            sessions: BTreeMap::new(),
            retirement: Retirement::default(),
            memberships: members::Memberships::new(),
            session_groups: members::SessionGroups::default(),
            session_owners: BTreeMap::new(),
        };
        for _ in 0..r.count("streams", 10)? {
            let name = r.string("stream")?.to_owned();
            let mut stream = StreamMeta {
                id: r.u32("stream_id")?,
                ..StreamMeta::default()
            };
            for _ in 0..r.count("topics", 10)? {
                let topic_name = r.string("topic")?.to_owned();
                let id = r.u32("topic_id")?;
                let settings = decode_settings(&mut r)?;
                let epoch = r.u64("epoch")?;
                let mut partitions = Vec::new();
                for _ in 0..r.count("partitions", 13)? {
                    let id = r.u32("partition")?;
                    let hash_start = r.u16("hash_start")?;
                    let hash_end = r.u16("hash_end")?;
                    let mut parents = Vec::new();
                    for _ in 0..r.count("parents", 4)? {
                        parents.push(r.u32("parent")?);
                    }
                    partitions.push(PartitionMeta {
                        id,
                        hash_start,
                        hash_end,
                        parents,
                        sealed: r.bool("sealed")?,
                        created_op: 0,
                    });
                }
                stream.topics.insert(
                    topic_name,
                    TopicMeta {
                        id,
                        settings,
                        epoch,
                        partitions,
                    },
                );
            }
            for _ in 0..r.count("groups", 10)? {
                let group_name = r.string("group")?.to_owned();
                let mut group = GroupMeta {
                    topic: r.string("topic")?.to_owned(),
                    offsets: BTreeMap::new(),
                };
                for _ in 0..r.count("offsets", 12)? {
                    group.offsets.insert(r.u32("partition")?, r.u64("offset")?);
                }
                stream.groups.insert(group_name, group);
            }
            meta.streams.insert(name, stream);
        }
        if r.remaining() > 0 {
            for _ in 0..r.count("users", 46)? {
                let name = r.string("user")?.to_owned();
                let credential = credential(&mut r)?;
                let mut grants = BTreeMap::new();
                for _ in 0..r.count("grants", 4)? {
                    let grant = Grant::decode(&mut r)?;
                    grants.insert(grant.resource, grant.permissions);
                }
                meta.users.insert(name, UserMeta { credential, grants });
            }
        }
        if r.remaining() > 0 {
            (meta.applied_op, meta.sessions) = sessions::decode(&mut r)?;
        }
        if r.remaining() > 0 {
            meta.retirement = Retirement::decode(&mut r)?;
        }
        if r.remaining() > 0 {
            meta.decode_created(&mut r)?;
        }
        if r.remaining() > 0 {
            meta.memberships = members::decode(&mut r)?;
            meta.session_groups = members::SessionGroups::of(&meta.memberships);
        }
        if r.remaining() > 0 {
            meta.session_owners = sessions::decode_owners(&mut r)?;
        }
        r.finish()?;
        Ok(meta)
    }
}

#[cfg(test)]
mod tests;
