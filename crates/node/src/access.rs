//! Who may do what: the users and grants of the metadata as every shard checks them,
//! and the permission each request needs. Pure: no sockets, no clock.
//!
//! Stream requests need a permission on their stream (or on every stream, `*`); the
//! node's requests need a node permission. Listing shows only what the user may see.

use std::collections::HashMap;

use braid_proto::client::{Request, Resource, MANAGE, READ, STREAMS, USERS, WRITE};
use braid_proto::scram::ScramCredential;

use crate::metadata::{Metadata, UserMeta};

/// What one request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need<'a> {
    /// Nothing (ping, authenticate).
    Nothing,
    /// Any authenticated user (listing, filtered by what it may see).
    Authenticated,
    /// A node permission.
    Node(u8),
    /// A permission on a stream.
    Stream(&'a str, u8),
    /// Any permission on a stream (describing it).
    SeeStream(&'a str),
    /// `MANAGE` on the stream or `STREAMS` on the node (deleting a stream).
    DeleteStream(&'a str),
    /// Being this user, or `USERS` on the node (changing a password).
    UserOrUsers(&'a str),
}

impl Need<'_> {
    /// What is missing, for the `PermissionDenied` message.
    pub(crate) fn describe(&self) -> String {
        let name = braid_proto::client::permission_names;
        match self {
            Self::Nothing | Self::Authenticated => "nothing".into(),
            Self::Node(bits) => format!("{} on the node", name(*bits)),
            Self::Stream(stream, bits) => format!("{} on stream {stream}", name(*bits)),
            Self::SeeStream(stream) => format!("a permission on stream {stream}"),
            Self::DeleteStream(stream) => {
                format!("manage on stream {stream} or streams on the node")
            }
            Self::UserOrUsers(user) => format!("to be user {user}, or users on the node"),
        }
    }
}

/// The permission `request` needs.
pub(crate) fn need_of<'a>(request: &Request<'a>) -> Need<'a> {
    match request {
        Request::Ping | Request::Authenticate { .. } => Need::Nothing,
        Request::ListStreams
        | Request::ClusterInfo
        | Request::NodeStatus
        | Request::RegisterSession { .. }
        | Request::EndSession { .. }
        | Request::SessionHeartbeat { .. } => Need::Authenticated,
        Request::CreateStream { .. } => Need::Node(STREAMS),
        Request::DeleteStream { name } => Need::DeleteStream(name),
        Request::CreateTopic { stream, .. } | Request::DeleteTopic { stream, .. } => {
            Need::Stream(stream, MANAGE)
        }
        Request::ListTopics { stream } | Request::DescribeTopic { stream, .. } => {
            Need::SeeStream(stream)
        }
        Request::Produce { stream, .. } => Need::Stream(stream, WRITE),
        Request::Fetch { stream, .. }
        | Request::ListOffsets { stream, .. }
        | Request::JoinGroup { stream, .. }
        | Request::LeaveGroup { stream, .. }
        | Request::FetchOffsets { stream, .. }
        | Request::ListGroups { stream }
        | Request::DescribeGroup { stream, .. } => Need::Stream(stream, READ),
        Request::Heartbeat { member, .. } | Request::CommitOffsets { member, .. } => {
            Need::Stream(member.stream, READ)
        }
        Request::CreateUser { .. }
        | Request::DeleteUser { .. }
        | Request::ListUsers
        | Request::GrantPermissions { .. }
        | Request::RevokePermissions { .. } => Need::Node(USERS),
        Request::ChangePassword { name, .. } => Need::UserOrUsers(name),
        // A command added to the protocol but not here is refused until it is.
        _ => Need::Node(USERS | STREAMS),
    }
}

/// One user as the shards see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UserAccess {
    credential: ScramCredential,
    node: u8,
    all_streams: u8,
    streams: HashMap<String, u8>,
}

impl UserAccess {
    /// The user as its metadata says.
    pub(crate) fn of(user: &UserMeta) -> Self {
        let mut access = Self {
            credential: user.credential.clone(),
            node: 0,
            all_streams: 0,
            streams: HashMap::new(),
        };
        for (resource, bits) in &user.grants {
            match resource {
                Resource::Node => access.node |= bits,
                Resource::AllStreams => access.all_streams |= bits,
                Resource::Stream(stream) => {
                    access.streams.insert(stream.clone(), *bits);
                }
            }
        }
        access
    }
}

/// Every user's credential and permissions, changed user by user with the metadata.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Access {
    users: HashMap<String, UserAccess>,
}

impl Access {
    pub(crate) fn from_metadata(meta: &Metadata) -> Self {
        let users = meta
            .users
            .iter()
            .map(|(name, user)| (name.clone(), UserAccess::of(user)))
            .collect();
        Self { users }
    }

    /// Sets `user` to what `access` says, or removes it.
    pub(crate) fn set(&mut self, user: &str, access: Option<UserAccess>) {
        match access {
            Some(access) => {
                self.users.insert(user.to_owned(), access);
            }
            None => {
                self.users.remove(user);
            }
        }
    }

    /// The credential of `user`, if it exists.
    pub(crate) fn credential(&self, user: &str) -> Option<ScramCredential> {
        self.users.get(user).map(|u| u.credential.clone())
    }

    /// Whether `user` exists with the credential whose `StoredKey` is `key` (what a
    /// login is bound to).
    pub(crate) fn holds(&self, user: &str, key: &[u8; 32]) -> bool {
        self.users
            .get(user)
            .is_some_and(|u| u.credential.stored_key == *key)
    }

    fn stream_bits(user: &UserAccess, stream: &str) -> u8 {
        user.all_streams | user.streams.get(stream).copied().unwrap_or(0)
    }

    /// Whether `user` has what `need` asks.
    pub(crate) fn allows(&self, user: &str, need: Need<'_>) -> bool {
        let Some(u) = self.users.get(user) else {
            return matches!(need, Need::Nothing);
        };
        match need {
            Need::UserOrUsers(name) => name == user || u.node & USERS != 0,
            Need::Nothing | Need::Authenticated => true,
            Need::Node(bits) => u.node & bits == bits,
            Need::Stream(stream, bits) => Self::stream_bits(u, stream) & bits == bits,
            Need::SeeStream(stream) => Self::stream_bits(u, stream) != 0 || u.node & STREAMS != 0,
            Need::DeleteStream(stream) => {
                Self::stream_bits(u, stream) & MANAGE != 0 || u.node & STREAMS != 0
            }
        }
    }

    /// Whether `user` may see `stream` in a listing.
    pub(crate) fn sees_stream(&self, user: &str, stream: &str) -> bool {
        self.allows(user, Need::SeeStream(stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::{op, MetaOp};
    use braid_proto::client::{Grant, GroupMemberRequest};

    fn meta() -> Metadata {
        let mut meta = Metadata::default();
        let credential = ScramCredential::derive("pw", b"salt", 4096);
        let grant = |user: &str, resource, permissions| {
            MetaOp::Grant(op::Grant {
                user: user.into(),
                grant: Grant {
                    resource,
                    permissions,
                },
            })
        };
        for op in [
            MetaOp::CreateStream(op::CreateStream { name: "a".into() }),
            MetaOp::CreateStream(op::CreateStream { name: "b".into() }),
            MetaOp::CreateUser(op::CreateUser {
                name: "reader".into(),
                credential: credential.clone(),
            }),
            MetaOp::CreateUser(op::CreateUser {
                name: "ops".into(),
                credential,
            }),
            grant("reader", Resource::Stream("a".into()), READ),
            grant("ops", Resource::AllStreams, READ | WRITE | MANAGE),
            grant("ops", Resource::Node, STREAMS),
        ] {
            meta.apply(&op).unwrap();
        }
        meta
    }

    #[test]
    fn every_request_checks_its_own_permission() {
        let access = Access::from_metadata(&meta());
        let fetch = |stream| Request::Fetch {
            stream,
            topic: "t",
            partition: 0,
            offset: 0,
            max_bytes: 1,
            max_wait_ms: 0,
        };
        let produce = Request::Produce {
            stream: "a",
            topic: "t",
            partition: 0,
            batch: b"",
        };
        let commit = Request::CommitOffsets {
            member: GroupMemberRequest {
                stream: "b",
                group: "g",
                member_id: 1,
                generation: 1,
            },
            offsets: vec![],
        };
        let allowed = |user: &str, request: &Request<'_>| access.allows(user, need_of(request));
        assert!(allowed("reader", &fetch("a")));
        assert!(!allowed("reader", &fetch("b")), "another stream");
        assert!(!allowed("reader", &produce), "write without the grant");
        assert!(!allowed("reader", &commit), "a group of another stream");
        assert!(!allowed("reader", &Request::DeleteStream { name: "a" }));
        assert!(!allowed("reader", &Request::ListUsers));
        assert!(allowed("reader", &Request::ListStreams));
        assert!(allowed("ops", &produce), "every stream");
        assert!(allowed("ops", &commit));
        assert!(allowed("ops", &Request::CreateStream { name: "c" }));
        assert!(allowed("ops", &Request::DeleteStream { name: "a" }));
        assert!(!allowed("ops", &Request::DeleteUser { name: "reader" }));
        let passwd = |name| Request::ChangePassword {
            name,
            salt: b"s",
            iterations: 4096,
            stored_key: &[0; 32],
            server_key: &[0; 32],
        };
        assert!(allowed("reader", &passwd("reader")), "its own password");
        assert!(
            !allowed("reader", &passwd("ops")),
            "another user's password"
        );
        assert!(!allowed("nobody", &fetch("a")), "an unknown user");
        assert!(allowed("nobody", &Request::Ping));
        assert!(access.sees_stream("reader", "a"));
        assert!(!access.sees_stream("reader", "b"));
        assert_eq!(need_of(&produce).describe(), "write on stream a");
    }
}
