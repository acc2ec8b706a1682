//! Metadata and group requests, served by shard 0, which owns the metadata store and
//! the group coordinator.

use braid_proto::client::{Request, TopicSettings};
use braid_proto::scram::{ScramCredential, KEY_BYTES};

use crate::metadata::{op, MetaOp};

/// An admin or group request with owned fields, sent to shard 0.
#[derive(Debug, Clone)]
pub(crate) enum AdminRequest {
    /// A change to the metadata as the client asked it, proposed as it is (after the
    /// node's quotas).
    Change(MetaOp),
    /// A topic create, whose settings take the node's defaults and limits first.
    CreateTopic {
        stream: String,
        topic: String,
        settings: TopicSettings,
    },
    ListTopics(String),
    DescribeTopic {
        stream: String,
        topic: String,
    },
    JoinGroup {
        stream: String,
        group: String,
        topic: String,
        member_name: String,
        session_timeout_ms: u32,
        session: u64,
        /// Who asks (a session's owner alone may join with it).
        user: Option<String>,
    },
    Heartbeat {
        stream: String,
        group: String,
        member_id: u64,
        owned: Vec<u32>,
        user: Option<String>,
    },
    LeaveGroup {
        stream: String,
        group: String,
        member_id: u64,
        user: Option<String>,
    },
    CommitOffsets {
        stream: String,
        group: String,
        member_id: u64,
        generation: u32,
        offsets: Vec<(u32, u64)>,
        user: Option<String>,
    },
    FetchOffsets {
        stream: String,
        group: String,
    },
    ListGroups(String),
    DescribeGroup {
        stream: String,
        group: String,
    },
    ListUsers,
    /// Open a client session; answered its id. A logged-in user's session is its
    /// alone.
    RegisterSession {
        timeout_ms: u32,
        user: Option<String>,
    },
    /// Keep a client session open.
    SessionHeartbeat {
        session: u64,
        user: Option<String>,
    },
    /// End a client session.
    EndSession {
        session: u64,
        user: Option<String>,
    },
}

impl AdminRequest {
    /// A consumer-group or client-session call (answered only by the coordinator, in
    /// a cluster: it watches both).
    pub(crate) fn is_group_call(&self) -> bool {
        matches!(
            self,
            Self::RegisterSession { .. }
                | Self::SessionHeartbeat { .. }
                | Self::EndSession { .. }
                | Self::JoinGroup { .. }
                | Self::Heartbeat { .. }
                | Self::LeaveGroup { .. }
                | Self::CommitOffsets { .. }
                | Self::FetchOffsets { .. }
                | Self::DescribeGroup { .. }
                | Self::ListGroups(_)
        )
    }
}

/// A key field the decoder checked to be [`KEY_BYTES`] long.
fn key(bytes: &[u8]) -> Option<[u8; KEY_BYTES]> {
    bytes.try_into().ok()
}

/// A request's credential fields (`CreateUser`, `ChangePassword`) as the metadata
/// keeps them.
fn credential(
    salt: &[u8],
    iterations: u32,
    stored_key: &[u8],
    server_key: &[u8],
) -> Option<ScramCredential> {
    Some(ScramCredential {
        salt: salt.to_vec(),
        iterations,
        stored_key: key(stored_key)?,
        server_key: key(server_key)?,
    })
}

/// The admin form of a request from `user` (`None`: nobody logged in), or `None` for
/// the requests the connection serves itself.
pub(crate) fn admin_request(request: &Request<'_>, user: Option<&str>) -> Option<AdminRequest> {
    let own = |s: &str| s.to_owned();
    fn change(op: impl Into<MetaOp>) -> AdminRequest {
        AdminRequest::Change(op.into())
    }
    Some(match request {
        // Served by the connection itself: the data path, and the stream list, which
        // the shard's layout holds and which is filtered by what the user may see.
        Request::Ping
        | Request::Produce { .. }
        | Request::Fetch { .. }
        | Request::ListOffsets { .. }
        | Request::ListStreams
        | Request::ClusterInfo
        | Request::NodeStatus => return None,
        Request::CreateStream { name } => change(op::CreateStream { name: own(name) }),
        Request::DeleteStream { name } => change(op::DeleteStream { name: own(name) }),
        Request::CreateTopic {
            stream,
            topic,
            settings,
        } => AdminRequest::CreateTopic {
            stream: own(stream),
            topic: own(topic),
            settings: *settings,
        },
        Request::DeleteTopic { stream, topic } => change(op::DeleteTopic {
            stream: own(stream),
            name: own(topic),
        }),
        Request::ListTopics { stream } => AdminRequest::ListTopics(own(stream)),
        Request::DescribeTopic { stream, topic } => AdminRequest::DescribeTopic {
            stream: own(stream),
            topic: own(topic),
        },
        Request::JoinGroup {
            stream,
            group,
            topic,
            member_name,
            session_timeout_ms,
            session,
        } => AdminRequest::JoinGroup {
            stream: own(stream),
            group: own(group),
            topic: own(topic),
            member_name: own(member_name),
            session_timeout_ms: *session_timeout_ms,
            session: *session,
            user: user.map(own),
        },
        Request::Heartbeat { member, owned } => AdminRequest::Heartbeat {
            stream: own(member.stream),
            group: own(member.group),
            member_id: member.member_id,
            owned: owned.clone(),
            user: user.map(own),
        },
        Request::LeaveGroup {
            stream,
            group,
            member_id,
        } => AdminRequest::LeaveGroup {
            stream: own(stream),
            group: own(group),
            member_id: *member_id,
            user: user.map(own),
        },
        Request::CommitOffsets { member, offsets } => AdminRequest::CommitOffsets {
            stream: own(member.stream),
            group: own(member.group),
            member_id: member.member_id,
            generation: member.generation,
            offsets: offsets.clone(),
            user: user.map(own),
        },
        Request::FetchOffsets { stream, group } => AdminRequest::FetchOffsets {
            stream: own(stream),
            group: own(group),
        },
        Request::ListGroups { stream } => AdminRequest::ListGroups(own(stream)),
        Request::DescribeGroup { stream, group } => AdminRequest::DescribeGroup {
            stream: own(stream),
            group: own(group),
        },
        Request::CreateUser {
            name,
            salt,
            iterations,
            stored_key,
            server_key,
        } => change(op::CreateUser {
            name: own(name),
            credential: credential(salt, *iterations, stored_key, server_key)?,
        }),
        Request::ChangePassword {
            name,
            salt,
            iterations,
            stored_key,
            server_key,
        } => change(op::SetCredential {
            name: own(name),
            credential: credential(salt, *iterations, stored_key, server_key)?,
        }),
        Request::DeleteUser { name } => change(op::DeleteUser { name: own(name) }),
        Request::ListUsers => AdminRequest::ListUsers,
        Request::GrantPermissions { user, grant } => change(op::Grant {
            user: own(user),
            grant: grant.clone(),
        }),
        Request::RevokePermissions { user, grant } => change(op::Revoke {
            user: own(user),
            grant: grant.clone(),
        }),
        Request::RegisterSession { timeout_ms } => AdminRequest::RegisterSession {
            timeout_ms: *timeout_ms,
            user: user.map(own),
        },
        Request::EndSession { session } => AdminRequest::EndSession {
            session: *session,
            user: user.map(own),
        },
        Request::SessionHeartbeat { session } => AdminRequest::SessionHeartbeat {
            session: *session,
            user: user.map(own),
        },
        _ => return None,
    })
}
