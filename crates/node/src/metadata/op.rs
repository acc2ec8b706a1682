//! The metadata's operations, each defined once: its code in the durable log, its
//! check, its application, what it touches and its encoding sit together in one
//! [`Change`] impl, and one line of [`meta_ops!`] makes it a [`MetaOp`]. A new
//! operation is a struct, its impl and that line; nothing else dispatches on it.
//!
//! The codes are the durable format: a code is never reused or renumbered, and an op's
//! fields change only under a new code (see `docs/format.md`).

use std::collections::BTreeMap;

use braid_proto::client::{Grant as GrantOf, Resource, TopicSettings, USERS};
use braid_proto::hash::equal_ranges;
use braid_proto::scram::ScramCredential;
use braid_proto::wire::{WireError, WireReader, WireWrite};

pub use super::members::{JoinGroup, LeaveGroup};
pub use super::retirement::{FinalizeSession, ReportRetirement};
pub use super::sessions::{EndSession, RegisterOwnedSession, RegisterSession};
use super::{
    check_credential, check_name, credential, put_credential, MetaError, Metadata, PartitionMeta,
    StreamMeta, TopicMeta, Touch, UserMeta, TOPIC_PARTITIONS_MAX,
};

/// One kind of change to the metadata. `check` and `apply` run on every replica in
/// the same order, so both depend on the metadata alone (never on a node's settings
/// or clock): a check that needs those runs before the op is proposed.
pub trait Change: Sized {
    /// Its code in the durable log: never reused, never changed.
    const CODE: u8;
    /// Whether the op's number names what it makes (a session, a group member): a
    /// log op holds at most one such op.
    const NUMBERED: bool = false;
    /// Whether it applies to `meta`; the error is what the client is told.
    ///
    /// # Errors
    /// Why it is refused.
    fn check(&self, meta: &Metadata) -> Result<(), MetaError>;
    /// Applies it to `meta`, which `check` accepted.
    fn apply(&self, meta: &mut Metadata);
    /// What applying it touches, in the terms the layout and the access table are
    /// built from; asked before it is applied. Nothing by default (an offset commit).
    fn touches(&self, _meta: &Metadata) -> Vec<Touch> {
        Vec::new()
    }
    /// Appends its fields (the code is written before them).
    fn encode(&self, out: &mut Vec<u8>);
    /// Reads its fields.
    ///
    /// # Errors
    /// A [`WireError`].
    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError>;
}

/// Declares [`MetaOp`] over the [`Change`] types and dispatches to them.
macro_rules! meta_ops {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// A change to the metadata; the unit of the durable log.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum MetaOp {
            $( $(#[$doc])* $name($name), )*
        }

        $( impl From<$name> for MetaOp {
            fn from(op: $name) -> Self {
                Self::$name(op)
            }
        } )*

        impl MetaOp {
            /// Every op's code, in declaration order.
            const CODES: &'static [u8] = &[ $( <$name as Change>::CODE ),* ];

            fn code(&self) -> u8 {
                match self { $( Self::$name(_) => <$name as Change>::CODE, )* }
            }

            /// Whether the op's number names what it makes (a session, a group
            /// member): a log op holds at most one such op (a second is refused).
            pub(crate) fn is_numbered(&self) -> bool {
                match self { $( Self::$name(_) => <$name as Change>::NUMBERED, )* }
            }

            pub(super) fn check(&self, meta: &Metadata) -> Result<(), MetaError> {
                match self { $( Self::$name(op) => op.check(meta), )* }
            }

            pub(super) fn apply_checked(&self, meta: &mut Metadata) {
                match self { $( Self::$name(op) => op.apply(meta), )* }
            }

            pub(super) fn touches(&self, meta: &Metadata) -> Vec<Touch> {
                match self { $( Self::$name(op) => op.touches(meta), )* }
            }

            fn encode_fields(&self, out: &mut Vec<u8>) {
                match self { $( Self::$name(op) => op.encode(out), )* }
            }

            fn decode_fields(code: u8, r: &mut WireReader<'_>) -> Option<Result<Self, WireError>> {
                $( if code == <$name as Change>::CODE {
                    return Some(<$name as Change>::decode(r).map(Self::$name));
                } )*
                None
            }
        }
    };
}

meta_ops! {
    /// Create a stream.
    CreateStream,
    /// Delete a stream with its topics and groups.
    DeleteStream,
    /// Create a topic with equal hash ranges.
    CreateTopic,
    /// Delete a topic.
    DeleteTopic,
    /// Record consumed positions of a group.
    CommitOffsets,
    /// Keep new topic ids above a floor.
    RaiseTopicIdFloor,
    /// Create a user.
    CreateUser,
    /// Delete a user with its grants.
    DeleteUser,
    /// Add permissions on a resource to a user.
    Grant,
    /// Take permissions on a resource from a user.
    Revoke,
    /// Replace a user's credential.
    SetCredential,
    /// Open a client session.
    RegisterSession,
    /// End a client session.
    EndSession,
    /// A node's report of a walk over its copies for ended sessions.
    ReportRetirement,
    /// Retire (forget) ended sessions through an op.
    FinalizeSession,
    /// A consumer joins a group.
    JoinGroup,
    /// A consumer leaves a group.
    LeaveGroup,
    /// Open a client session that belongs to a user.
    RegisterOwnedSession,
}

// Two ops with one code would read each other's records back: refused at compile time.
const _: () = {
    let codes = MetaOp::CODES;
    let mut i = 0;
    while i < codes.len() {
        let mut j = i + 1;
        while j < codes.len() {
            assert!(codes[i] != codes[j], "two metadata ops share a code");
            j += 1;
        }
        i += 1;
    }
};

impl MetaOp {
    /// Appends the op's encoding: its code, then its fields.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u8_be(self.code());
        self.encode_fields(out);
    }

    /// Decodes one op that fills `bytes` exactly.
    ///
    /// # Errors
    /// A [`WireError`]: an unknown code, a field cut short, bytes left over.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut r = WireReader::new(bytes);
        let at = r.position();
        let code = r.u8("op")?;
        let op = Self::decode_fields(code, &mut r).unwrap_or(Err(WireError::BadValue {
            at,
            field: "op",
            value: code.into(),
        }))?;
        r.finish()?;
        Ok(op)
    }
}

fn string(r: &mut WireReader<'_>, field: &'static str) -> Result<String, WireError> {
    r.string(field).map(str::to_owned)
}

/// The fields of an op on a user's grants (Grant, Revoke): `user: string, grant: Grant`.
fn put_user_grant(out: &mut Vec<u8>, user: &str, grant: &GrantOf) {
    out.put_string(user);
    grant.encode_into(out);
}

fn user_grant(r: &mut WireReader<'_>) -> Result<(String, GrantOf), WireError> {
    Ok((string(r, "user")?, GrantOf::decode(r)?))
}

/// The fields of an op that sets a user's credential (CreateUser, SetCredential):
/// `name: string`, then the credential.
fn put_named_credential(out: &mut Vec<u8>, name: &str, credential: &ScramCredential) {
    out.put_string(name);
    put_credential(out, credential);
}

fn named_credential(r: &mut WireReader<'_>) -> Result<(String, ScramCredential), WireError> {
    Ok((string(r, "name")?, credential(r)?))
}

/// Create a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateStream {
    /// Its name.
    pub name: String,
}

impl Change for CreateStream {
    const CODE: u8 = 1;
    fn check(&self, meta: &Metadata) -> Result<(), MetaError> {
        check_name("stream", &self.name)?;
        if meta.streams.contains_key(&self.name) {
            return Err(MetaError::StreamExists(self.name.clone()));
        }
        Ok(())
    }
    fn apply(&self, meta: &mut Metadata) {
        let id = meta.next_stream_id;
        meta.next_stream_id += 1;
        let stream = StreamMeta {
            id,
            ..StreamMeta::default()
        };
        meta.streams.insert(self.name.clone(), stream);
    }
    fn touches(&self, _meta: &Metadata) -> Vec<Touch> {
        vec![Touch::Stream(self.name.clone())]
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.put_string(&self.name);
    }
    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        Ok(Self {
            name: string(r, "name")?,
        })
    }
}

/// Delete a stream with its topics and groups, and every grant on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteStream {
    /// Its name.
    pub name: String,
}

impl Change for DeleteStream {
    const CODE: u8 = 2;
    fn check(&self, meta: &Metadata) -> Result<(), MetaError> {
        meta.stream(&self.name).map(|_| ())
    }
    fn apply(&self, meta: &mut Metadata) {
        meta.streams.remove(&self.name);
        super::members::forget(meta, &self.name, None);
        // A stream made later under the same name is a new stream: grants on this one
        // must not carry over to it.
        let resource = Resource::Stream(self.name.clone());
        for user in meta.users.values_mut() {
            user.grants.remove(&resource);
        }
    }
    fn touches(&self, meta: &Metadata) -> Vec<Touch> {
        let resource = Resource::Stream(self.name.clone());
        let granted = meta
            .users
            .iter()
            .filter(|(_, user)| user.grants.contains_key(&resource))
            .map(|(user, _)| Touch::User(user.clone()));
        std::iter::once(Touch::Stream(self.name.clone()))
            .chain(granted)
            .collect()
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.put_string(&self.name);
    }
    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        Ok(Self {
            name: string(r, "name")?,
        })
    }
}

/// Create a topic whose partitions split the key hashes in equal ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateTopic {
    /// The stream.
    pub stream: String,
    /// The topic.
    pub name: String,
    /// Its settings, the node's defaults filled in before it is proposed.
    pub settings: TopicSettings,
}

impl Change for CreateTopic {
    const CODE: u8 = 3;
    fn check(&self, meta: &Metadata) -> Result<(), MetaError> {
        check_name("topic", &self.name)?;
        if meta.stream(&self.stream)?.topics.contains_key(&self.name) {
            return Err(MetaError::TopicExists {
                stream: self.stream.clone(),
                topic: self.name.clone(),
            });
        }
        if !(1..=TOPIC_PARTITIONS_MAX).contains(&self.settings.partitions) {
            return Err(MetaError::Invalid(format!(
                "partitions must be between 1 and {TOPIC_PARTITIONS_MAX}, not {}",
                self.settings.partitions
            )));
        }
        Ok(())
    }
    fn apply(&self, meta: &mut Metadata) {
        let id = meta.next_topic_id;
        meta.next_topic_id += 1;
        let partitions = equal_ranges(self.settings.partitions)
            .into_iter()
            .enumerate()
            .map(|(i, (hash_start, hash_end))| PartitionMeta {
                id: i as u32,
                hash_start,
                hash_end,
                parents: Vec::new(),
                sealed: false,
                created_op: meta.applied_op,
            })
            .collect();
        let topic = TopicMeta {
            id,
            settings: self.settings,
            epoch: 1,
            partitions,
        };
        if let Some(stream) = meta.streams.get_mut(&self.stream) {
            stream.topics.insert(self.name.clone(), topic);
        }
    }
    fn touches(&self, _meta: &Metadata) -> Vec<Touch> {
        vec![Touch::Topic {
            stream: self.stream.clone(),
            topic: self.name.clone(),
        }]
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.put_string(&self.stream);
        out.put_string(&self.name);
        self.settings.encode_into(out);
    }
    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        Ok(Self {
            stream: string(r, "stream")?,
            name: string(r, "name")?,
            settings: TopicSettings::decode(r)?,
        })
    }
}

/// Delete a topic and the groups that consume it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteTopic {
    /// The stream.
    pub stream: String,
    /// The topic.
    pub name: String,
}

impl Change for DeleteTopic {
    const CODE: u8 = 4;
    fn check(&self, meta: &Metadata) -> Result<(), MetaError> {
        meta.topic(&self.stream, &self.name).map(|_| ())
    }
    fn apply(&self, meta: &mut Metadata) {
        if let Some(stream) = meta.streams.get_mut(&self.stream) {
            stream.topics.remove(&self.name);
            stream.groups.retain(|_, group| group.topic != self.name);
        }
        super::members::forget(meta, &self.stream, Some(&self.name));
    }
    fn touches(&self, _meta: &Metadata) -> Vec<Touch> {
        vec![Touch::Topic {
            stream: self.stream.clone(),
            topic: self.name.clone(),
        }]
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.put_string(&self.stream);
        out.put_string(&self.name);
    }
    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        Ok(Self {
            stream: string(r, "stream")?,
            name: string(r, "name")?,
        })
    }
}

/// Record consumed positions of a group (a group that consumed another topic before
/// forgets that topic's offsets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitOffsets {
    /// The stream.
    pub stream: String,
    /// The group.
    pub group: String,
    /// The topic it consumes.
    pub topic: String,
    /// (partition, next offset).
    pub offsets: Vec<(u32, u64)>,
}

impl Change for CommitOffsets {
    const CODE: u8 = 5;
    fn check(&self, meta: &Metadata) -> Result<(), MetaError> {
        check_name("group", &self.group)?;
        let topic = meta.topic(&self.stream, &self.topic)?;
        for (partition, _) in &self.offsets {
            if !topic.partitions.iter().any(|p| p.id == *partition) {
                return Err(MetaError::Invalid(format!(
                    "topic {}/{} has no partition {partition}",
                    self.stream, self.topic
                )));
            }
        }
        Ok(())
    }
    fn apply(&self, meta: &mut Metadata) {
        if let Some(stream) = meta.streams.get_mut(&self.stream) {
            let entry = stream.groups.entry(self.group.clone()).or_default();
            if entry.topic != self.topic {
                entry.topic = self.topic.clone();
                entry.offsets.clear();
            }
            for (partition, offset) in &self.offsets {
                entry.offsets.insert(*partition, *offset);
            }
        }
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.put_string(&self.stream);
        out.put_string(&self.group);
        out.put_string(&self.topic);
        out.put_u32_be(self.offsets.len() as u32);
        for (partition, offset) in &self.offsets {
            out.put_u32_be(*partition);
            out.put_u64_be(*offset);
        }
    }
    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        let stream = string(r, "stream")?;
        let group = string(r, "group")?;
        let topic = string(r, "topic")?;
        let count = r.count("offsets", 12)?;
        let mut offsets = Vec::with_capacity(count as usize);
        for _ in 0..count {
            offsets.push((r.u32("partition")?, r.u64("offset")?));
        }
        Ok(Self {
            stream,
            group,
            topic,
            offsets,
        })
    }
}

/// Never give a new topic an id below `floor`: found at start, when partition
/// directories exist for ids the metadata does not know (its log was lost), so a new
/// topic is never served an old topic's records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaiseTopicIdFloor {
    /// The lowest id a new topic may get.
    pub floor: u32,
}

impl Change for RaiseTopicIdFloor {
    const CODE: u8 = 6;
    fn check(&self, _meta: &Metadata) -> Result<(), MetaError> {
        Ok(())
    }
    fn apply(&self, meta: &mut Metadata) {
        meta.next_topic_id = meta.next_topic_id.max(self.floor);
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.put_u32_be(self.floor);
    }
    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        Ok(Self {
            floor: r.u32("floor")?,
        })
    }
}

/// Create a user, with no grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateUser {
    /// Its name.
    pub name: String,
    /// Its credential.
    pub credential: ScramCredential,
}

impl Change for CreateUser {
    const CODE: u8 = 7;
    fn check(&self, meta: &Metadata) -> Result<(), MetaError> {
        check_name("user", &self.name)?;
        if meta.users.contains_key(&self.name) {
            return Err(MetaError::UserExists(self.name.clone()));
        }
        check_credential(&self.credential)
    }
    fn apply(&self, meta: &mut Metadata) {
        let user = UserMeta {
            credential: self.credential.clone(),
            grants: BTreeMap::new(),
        };
        meta.users.insert(self.name.clone(), user);
    }
    fn touches(&self, _meta: &Metadata) -> Vec<Touch> {
        vec![Touch::User(self.name.clone())]
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_named_credential(out, &self.name, &self.credential);
    }
    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        let (name, credential) = named_credential(r)?;
        Ok(Self { name, credential })
    }
}

/// Delete a user with its grants (never the last one that may manage users).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteUser {
    /// Its name.
    pub name: String,
}

impl Change for DeleteUser {
    const CODE: u8 = 8;
    fn check(&self, meta: &Metadata) -> Result<(), MetaError> {
        meta.keeps_a_user_manager(&self.name, USERS)
    }
    fn apply(&self, meta: &mut Metadata) {
        meta.users.remove(&self.name);
        // A user made again under the name never inherits what this one held.
        super::sessions::end_owned_by(meta, &self.name);
        super::members::forget_user(meta, &self.name);
    }
    fn touches(&self, meta: &Metadata) -> Vec<Touch> {
        let mut touched = vec![Touch::User(self.name.clone())];
        touched.extend(
            meta.session_owners
                .iter()
                .filter(|(_, user)| **user == self.name)
                .map(|(session, _)| Touch::Session(*session)),
        );
        touched
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.put_string(&self.name);
    }
    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        Ok(Self {
            name: string(r, "name")?,
        })
    }
}

/// Whether `grant` can be given to or taken from `user`: a known user, permissions
/// that apply to the resource, a well-formed stream name.
fn check_grant(meta: &Metadata, user: &str, grant: &GrantOf) -> Result<(), MetaError> {
    meta.user(user)?;
    if grant.permissions == 0 || grant.permissions & !grant.resource.permissions_allowed() != 0 {
        return Err(MetaError::Invalid(format!(
            "permissions {:#x} do not apply to {}",
            grant.permissions, grant.resource
        )));
    }
    if let Resource::Stream(stream) = &grant.resource {
        check_name("stream", stream)?;
    }
    Ok(())
}

/// Add permissions on a resource (an existing stream, or the node) to a user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The user.
    pub user: String,
    /// What to add.
    pub grant: GrantOf,
}

impl Change for Grant {
    const CODE: u8 = 9;
    fn check(&self, meta: &Metadata) -> Result<(), MetaError> {
        check_grant(meta, &self.user, &self.grant)?;
        if let Resource::Stream(stream) = &self.grant.resource {
            meta.stream(stream)?;
        }
        Ok(())
    }
    fn apply(&self, meta: &mut Metadata) {
        if let Some(user) = meta.users.get_mut(&self.user) {
            *user.grants.entry(self.grant.resource.clone()).or_default() |= self.grant.permissions;
        }
    }
    fn touches(&self, _meta: &Metadata) -> Vec<Touch> {
        vec![Touch::User(self.user.clone())]
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_user_grant(out, &self.user, &self.grant);
    }
    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        let (user, grant) = user_grant(r)?;
        Ok(Self { user, grant })
    }
}

/// Take permissions on a resource from a user (on any stream, existing or not, so
/// that stale grants can be cleaned up; never the last user's right to manage users).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revoke {
    /// The user.
    pub user: String,
    /// What to take away.
    pub grant: GrantOf,
}

impl Change for Revoke {
    const CODE: u8 = 10;
    fn check(&self, meta: &Metadata) -> Result<(), MetaError> {
        meta.user(&self.user)?;
        if self.grant.resource == Resource::Node {
            meta.keeps_a_user_manager(&self.user, self.grant.permissions)?;
        }
        check_grant(meta, &self.user, &self.grant)
    }
    fn apply(&self, meta: &mut Metadata) {
        if let Some(user) = meta.users.get_mut(&self.user) {
            if let Some(bits) = user.grants.get_mut(&self.grant.resource) {
                *bits &= !self.grant.permissions;
                if *bits == 0 {
                    user.grants.remove(&self.grant.resource);
                }
            }
        }
    }
    fn touches(&self, _meta: &Metadata) -> Vec<Touch> {
        vec![Touch::User(self.user.clone())]
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_user_grant(out, &self.user, &self.grant);
    }
    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        let (user, grant) = user_grant(r)?;
        Ok(Self { user, grant })
    }
}

/// Replace a user's credential (a new password); its grants stay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetCredential {
    /// Its name.
    pub name: String,
    /// Its new credential.
    pub credential: ScramCredential,
}

impl Change for SetCredential {
    const CODE: u8 = 11;
    fn check(&self, meta: &Metadata) -> Result<(), MetaError> {
        meta.user(&self.name)?;
        check_credential(&self.credential)
    }
    fn apply(&self, meta: &mut Metadata) {
        if let Some(user) = meta.users.get_mut(&self.name) {
            user.credential = self.credential.clone();
        }
    }
    fn touches(&self, _meta: &Metadata) -> Vec<Touch> {
        vec![Touch::User(self.name.clone())]
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_named_credential(out, &self.name, &self.credential);
    }
    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        let (name, credential) = named_credential(r)?;
        Ok(Self { name, credential })
    }
}
