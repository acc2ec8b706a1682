//! Users and permissions as the protocol carries them.
//!
//! A grant gives a user permissions on a resource: one stream, every stream (`*`), or
//! the node. Stream permissions are [`READ`], [`WRITE`] and [`MANAGE`]; node
//! permissions are [`USERS`] (manage users and grants) and [`STREAMS`] (create and
//! delete streams).

use crate::wire::{WireError, WireReader, WireWrite};

/// Read a stream: fetch, list offsets, consumer groups, describe.
pub const READ: u8 = 1;
/// Write a stream: produce.
pub const WRITE: u8 = 1 << 1;
/// Manage a stream: create and delete its topics, delete it.
pub const MANAGE: u8 = 1 << 2;
/// On the node: create and delete users and grant and revoke permissions.
pub const USERS: u8 = 1 << 3;
/// On the node: create and delete any stream.
pub const STREAMS: u8 = 1 << 4;
/// Every permission a stream resource takes.
pub const STREAM_PERMISSIONS: u8 = READ | WRITE | MANAGE;
/// Every permission the node resource takes.
pub const NODE_PERMISSIONS: u8 = USERS | STREAMS;

/// What a grant is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    /// The node itself (kind 0).
    Node,
    /// Every stream, present and future (kind 1).
    AllStreams,
    /// One stream by name (kind 2).
    Stream(String),
}

impl Resource {
    /// The permission bits this resource takes.
    pub fn permissions_allowed(&self) -> u8 {
        match self {
            Self::Node => NODE_PERMISSIONS,
            Self::AllStreams | Self::Stream(_) => STREAM_PERMISSIONS,
        }
    }

    /// Parses `node`, `*` or `stream:NAME` (the CLI's spelling).
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "node" => Some(Self::Node),
            "*" | "stream:*" => Some(Self::AllStreams),
            other => other
                .strip_prefix("stream:")
                .filter(|name| !name.is_empty())
                .map(|name| Self::Stream(name.to_owned())),
        }
    }
}

impl std::fmt::Display for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Node => f.write_str("node"),
            Self::AllStreams => f.write_str("stream:*"),
            Self::Stream(name) => write!(f, "stream:{name}"),
        }
    }
}

/// Permissions on one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The resource.
    pub resource: Resource,
    /// Permission bits ([`READ`], [`WRITE`], [`MANAGE`], [`USERS`], [`STREAMS`]).
    pub permissions: u8,
}

/// A user in `ListUsers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserSummary {
    /// The user's name.
    pub name: String,
    /// What the user may do.
    pub grants: Vec<Grant>,
}

/// The names of permission bits, in order: `read,write,manage,users,streams`.
pub fn permission_names(bits: u8) -> String {
    let names = [
        (READ, "read"),
        (WRITE, "write"),
        (MANAGE, "manage"),
        (USERS, "users"),
        (STREAMS, "streams"),
    ];
    names
        .iter()
        .filter(|(bit, _)| bits & bit != 0)
        .map(|(_, name)| *name)
        .collect::<Vec<_>>()
        .join(",")
}

/// The bits of a comma-separated list of permission names, or the unknown name.
///
/// # Errors
/// The first name that is not a permission.
pub fn parse_permissions(text: &str) -> Result<u8, String> {
    text.split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .try_fold(0u8, |bits, name| {
            let bit = match name {
                "read" => READ,
                "write" => WRITE,
                "manage" => MANAGE,
                "users" => USERS,
                "streams" => STREAMS,
                "all" => STREAM_PERMISSIONS,
                other => return Err(other.to_owned()),
            };
            Ok(bits | bit)
        })
}

const KIND_NODE: u8 = 0;
const KIND_ALL_STREAMS: u8 = 1;
const KIND_STREAM: u8 = 2;

impl Grant {
    /// Appends the wire form: `kind: u8`, `stream: string` (empty unless kind 2),
    /// `permissions: u8`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let (kind, name) = match &self.resource {
            Resource::Node => (KIND_NODE, ""),
            Resource::AllStreams => (KIND_ALL_STREAMS, ""),
            Resource::Stream(name) => (KIND_STREAM, name.as_str()),
        };
        out.put_u8_be(kind);
        out.put_string(name);
        out.put_u8_be(self.permissions);
    }

    /// Reads the wire form, checking the permissions fit the resource (at least one,
    /// none it cannot take) and a stream's name follows the name rule.
    ///
    /// # Errors
    /// A [`WireError`].
    pub fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        let at = r.position();
        let kind = r.u8("resource_kind")?;
        let name_at = r.position();
        let name = r.string("stream")?;
        let resource = match (kind, name) {
            (KIND_NODE, "") => Resource::Node,
            (KIND_ALL_STREAMS, "") => Resource::AllStreams,
            (KIND_STREAM, name) => {
                super::request::check_name(name, name_at, "stream")?;
                Resource::Stream(name.to_owned())
            }
            (KIND_NODE | KIND_ALL_STREAMS, _) => {
                return Err(WireError::InvalidName {
                    at: name_at,
                    field: "stream",
                    reason: "not empty for a node or all-streams grant",
                })
            }
            (other, _) => {
                return Err(WireError::BadValue {
                    at,
                    field: "resource_kind",
                    value: other.into(),
                })
            }
        };
        let at = r.position();
        let permissions = r.u8("permissions")?;
        if permissions == 0 || permissions & !resource.permissions_allowed() != 0 {
            return Err(WireError::BadValue {
                at,
                field: "permissions",
                value: permissions.into(),
            });
        }
        Ok(Self {
            resource,
            permissions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_round_trip_and_bad_ones_are_refused() {
        for grant in [
            Grant {
                resource: Resource::Node,
                permissions: USERS | STREAMS,
            },
            Grant {
                resource: Resource::AllStreams,
                permissions: READ,
            },
            Grant {
                resource: Resource::Stream("orders".into()),
                permissions: READ | WRITE | MANAGE,
            },
        ] {
            let mut out = Vec::new();
            grant.encode_into(&mut out);
            let mut r = WireReader::new(&out);
            assert_eq!(Grant::decode(&mut r).unwrap(), grant);
            r.finish().unwrap();
        }
        let bad = |kind: u8, name: &str, permissions: u8| {
            let mut out = vec![kind];
            out.put_string(name);
            out.put_u8_be(permissions);
            Grant::decode(&mut WireReader::new(&out)).is_err()
        };
        assert!(bad(0, "", READ), "a stream permission on the node");
        assert!(bad(2, "orders", USERS), "a node permission on a stream");
        assert!(bad(2, "orders", 0), "no permission at all");
        assert!(bad(2, "../etc", READ), "a bad stream name");
        assert!(bad(2, "", READ), "an empty stream name");
        assert!(bad(0, "orders", USERS), "a name on the node");
        assert!(bad(9, "", READ), "an unknown kind");
    }

    #[test]
    fn the_cli_spelling_parses() {
        assert_eq!(Resource::parse("node"), Some(Resource::Node));
        assert_eq!(Resource::parse("*"), Some(Resource::AllStreams));
        assert_eq!(
            Resource::parse("stream:orders"),
            Some(Resource::Stream("orders".into()))
        );
        assert_eq!(Resource::parse("stream:"), None);
        assert_eq!(Resource::parse("orders"), None);
        assert_eq!(parse_permissions("read, write"), Ok(READ | WRITE));
        assert_eq!(parse_permissions("all"), Ok(STREAM_PERMISSIONS));
        assert_eq!(parse_permissions("read,fly"), Err("fly".into()));
        assert_eq!(permission_names(READ | MANAGE), "read,manage");
    }
}
