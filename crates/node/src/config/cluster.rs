//! The `[cluster]` settings: who the members are and how they reach each other.
//! Membership is static: every member's config lists the same members.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::{ConfigError, Secret};

/// Most members a cluster may have (one consensus group spans all of them).
pub const MEMBERS_MAX: usize = 16;
/// Fewest bytes of a cluster secret.
pub const SECRET_BYTES_MIN: usize = 16;

/// One member of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberSettings {
    /// Its id: members are numbered 0 to n-1.
    pub id: u8,
    /// Where the other members reach its replica bus.
    pub replica_addr: SocketAddr,
    /// Where clients reach it (what `ClusterInfo` and `NotLeader` tell them).
    pub client_addr: SocketAddr,
}

/// The `[cluster]` table. Without it a node is a cluster of one.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSettings {
    /// The cluster's name, recorded in every member's data directory: a node refuses a
    /// data directory of another cluster.
    pub id: String,
    /// This node's member id.
    pub node_id: u8,
    /// Every member, this one included (`[[cluster.members]]`).
    pub members: Vec<MemberSettings>,
    /// Links of the replica bus to each peer (k).
    pub links_per_peer: u16,
    /// A peer that stops acknowledging is cut off after this long (TCP_USER_TIMEOUT of
    /// replica sockets) and its primaries are replaced after missed heartbeats (ms).
    pub heartbeat_timeout_ms: u64,
    /// A file holding the cluster secret that authenticates the replica hello (first
    /// line). Or `BRAID_CLUSTER_SECRET`; never a flag, which would show in `ps`.
    pub secret_file: Option<PathBuf>,
    /// The secret from `BRAID_CLUSTER_SECRET`.
    #[serde(skip)]
    pub secret: Option<Secret>,
    /// A file of this member's link keys, one per peer (`braid cluster member-keys`
    /// writes it from a master secret kept off the members): with it, a member can
    /// prove only its own id on the replica bus, where any holder of a shared cluster
    /// secret can pose as any member. Used instead of the secret.
    pub member_keys_file: Option<PathBuf>,
    /// This member lost its data (its data directory was deleted or replaced) and
    /// rejoins: `braid server --rejoin`. Recorded in the data directory; its groups
    /// start untrusted, so it never helps a view change drop an op it once
    /// acknowledged. A member rejoining without it could.
    pub rejoin: bool,
    /// This member starts for the first time, in a new cluster: its empty data
    /// directory is new, not lost (`braid server --init`). Without it (or `rejoin`), a
    /// member of a cluster of several refuses an empty data directory: it cannot tell
    /// a first start from a member whose disk was wiped, and a wiped member that
    /// started as new could help its peers drop records it had acknowledged. Used on
    /// the first start only; leave it out of a config kept for later starts.
    pub init: bool,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            id: String::new(),
            node_id: 0,
            members: Vec::new(),
            links_per_peer: 1,
            heartbeat_timeout_ms: 2_000,
            secret_file: None,
            secret: None,
            member_keys_file: None,
            rejoin: false,
            init: false,
        }
    }
}

impl ClusterSettings {
    /// This node's own entry.
    pub fn this_member(&self) -> Option<&MemberSettings> {
        self.members.iter().find(|m| m.id == self.node_id)
    }

    /// The bus's 64-bit cluster id: FNV-1a of the name, the same on every member.
    pub fn bus_cluster_id(&self) -> u64 {
        self.id.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// The cluster secret, from the environment or the file.
    ///
    /// # Errors
    /// [`ConfigError`] if the file cannot be read, neither source is set for a cluster
    /// of more than one, or the secret is shorter than [`SECRET_BYTES_MIN`].
    pub fn read_secret(&self) -> Result<Option<Vec<u8>>, ConfigError> {
        let secret = match (&self.secret, &self.secret_file) {
            (Some(secret), _) => Some(secret.0.clone()),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                Some(text.lines().next().unwrap_or_default().to_owned())
            }
            (None, None) => None,
        };
        match secret {
            None if self.members.len() > 1 && self.member_keys_file.is_none() => {
                Err(ConfigError::Invalid(
                    "a cluster of more than one needs its member keys (cluster.member_keys_file) \
                     or a secret (cluster.secret_file or BRAID_CLUSTER_SECRET)"
                        .into(),
                ))
            }
            None => Ok(None),
            Some(secret) if secret.len() < SECRET_BYTES_MIN => Err(ConfigError::Invalid(format!(
                "the cluster secret must be at least {SECRET_BYTES_MIN} bytes"
            ))),
            Some(secret) => Ok(Some(secret.into_bytes())),
        }
    }

    /// What this member's bus links are keyed with: its member keys if
    /// `member_keys_file` is set (a key for every peer, each at least
    /// [`SECRET_BYTES_MIN`] bytes), else the cluster secret, else nothing.
    ///
    /// # Errors
    /// [`ConfigError`] if a file cannot be read or a key is missing or malformed.
    pub fn link_keys(&self) -> Result<braid_bus::LinkKeys, ConfigError> {
        let Some(path) = &self.member_keys_file else {
            return Ok(self
                .read_secret()?
                .map_or(braid_bus::LinkKeys::Off, braid_bus::LinkKeys::Shared));
        };
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        let bad = |m: String| ConfigError::Invalid(format!("{}: {m}", path.display()));
        let mut keys = std::collections::BTreeMap::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (peer, hex) = line
                .split_once(char::is_whitespace)
                .ok_or_else(|| bad(format!("{line:?} is not \"PEER HEXKEY\"")))?;
            let peer: u8 = peer
                .parse()
                .map_err(|_| bad(format!("{peer:?} is not a member id")))?;
            let key = decode_hex(hex.trim())
                .filter(|k| k.len() >= SECRET_BYTES_MIN)
                .ok_or_else(|| {
                    bad(format!(
                        "the key of member {peer} is not hex of 16 bytes or more"
                    ))
                })?;
            keys.insert(peer, key);
        }
        for member in self.members.iter().filter(|m| m.id != self.node_id) {
            if !keys.contains_key(&member.id) {
                return Err(bad(format!("no key for member {}", member.id)));
            }
        }
        Ok(braid_bus::LinkKeys::PerPeer(keys))
    }

    /// The member keys file of member `node_id` (one line per peer), derived from
    /// `master` for this cluster's name and members.
    pub fn member_keys_text(&self, master: &[u8], node_id: u8) -> String {
        let mut text = format!(
            "# braid member keys of member {node_id} of cluster {}: keep it private (0600)\n",
            self.id
        );
        for member in self.members.iter().filter(|m| m.id != node_id) {
            let key = braid_bus::pair_key(master, &self.id, node_id, member.id);
            let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
            text.push_str(&format!("{} {hex}\n", member.id));
        }
        text
    }

    /// Checks the table on its own: a name, members numbered 0 to n-1 with distinct
    /// addresses, this node among them, k and the heartbeat in range.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming what is wrong.
    pub fn check(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(format!("cluster: {m}")));
        let name_ok = !self.id.is_empty()
            && self.id.len() <= 64
            && self
                .id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !name_ok {
            return bad(format!(
                "id {:?} must be 1 to 64 characters of a-z, A-Z, 0-9, '-', '_', '.'",
                self.id
            ));
        }
        let n = self.members.len();
        if n == 0 || n > MEMBERS_MAX {
            return bad(format!("1 to {MEMBERS_MAX} members, not {n}"));
        }
        let mut ids: Vec<u8> = self.members.iter().map(|m| m.id).collect();
        ids.sort_unstable();
        if ids.iter().enumerate().any(|(i, id)| usize::from(*id) != i) {
            return bad(format!(
                "member ids must be 0 to {} once each, not {ids:?}",
                n - 1
            ));
        }
        for (i, a) in self.members.iter().enumerate() {
            for b in &self.members[i + 1..] {
                if a.replica_addr == b.replica_addr || a.client_addr == b.client_addr {
                    return bad(format!("members {} and {} share an address", a.id, b.id));
                }
            }
        }
        if self.this_member().is_none() {
            return bad(format!("node_id {} is not a member", self.node_id));
        }
        if !(1..=16).contains(&self.links_per_peer) {
            return bad(format!("links_per_peer {} (1 to 16)", self.links_per_peer));
        }
        if !(100..=super::TIMEOUT_MS_MAX).contains(&self.heartbeat_timeout_ms) {
            return bad(format!(
                "cluster.heartbeat_timeout_ms = {} is out of range: 100 to {} (1 day)",
                self.heartbeat_timeout_ms,
                super::TIMEOUT_MS_MAX
            ));
        }
        Ok(())
    }
}

/// Parses `BRAID_CLUSTER_MEMBERS`: `ID=REPLICA_ADDR/CLIENT_ADDR` entries separated by
/// commas, e.g. `0=10.0.0.1:7090/10.0.0.1:7070,1=...`.
///
/// # Errors
/// What is wrong with the first bad entry.
pub fn parse_members(text: &str) -> Result<Vec<MemberSettings>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let (id, addrs) = entry
                .split_once('=')
                .ok_or_else(|| format!("{entry:?} is not ID=REPLICA_ADDR/CLIENT_ADDR"))?;
            let (replica, client) = addrs
                .split_once('/')
                .ok_or_else(|| format!("{entry:?} is not ID=REPLICA_ADDR/CLIENT_ADDR"))?;
            let parse_addr = |a: &str| {
                a.parse::<SocketAddr>()
                    .map_err(|e| format!("{a:?} in {entry:?}: {e}"))
            };
            Ok(MemberSettings {
                id: id.parse().map_err(|e| format!("member id {id:?}: {e}"))?,
                replica_addr: parse_addr(replica)?,
                client_addr: parse_addr(client)?,
            })
        })
        .collect()
}

/// The bytes of a hex string, if it is one.
fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three() -> ClusterSettings {
        ClusterSettings {
            id: "test".into(),
            node_id: 1,
            members: parse_members(
                "0=127.0.0.1:7090/127.0.0.1:7070, 1=127.0.0.1:7091/127.0.0.1:7071,2=127.0.0.1:7092/127.0.0.1:7072",
            )
            .unwrap(),
            secret: Some(Secret("0123456789abcdef".into())),
            ..ClusterSettings::default()
        }
    }

    /// A member's keys file holds one key per peer, derived from the master for its
    /// pairs only: two members' files agree on their pair, and no file holds a pair
    /// it is not in. A missing peer, bad hex or a short key is refused by name.
    #[test]
    fn member_keys_are_per_pair_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = three();
        let master = b"the operator's master secret";
        let keys_of = |node_id: u8, text: &str| {
            let path = dir.path().join(format!("member-{node_id}.keys"));
            std::fs::write(&path, text).unwrap();
            ClusterSettings {
                node_id,
                secret: None,
                member_keys_file: Some(path),
                ..three()
            }
            .link_keys()
        };
        let per_peer =
            |node_id: u8| match keys_of(node_id, &cluster.member_keys_text(master, node_id)) {
                Ok(braid_bus::LinkKeys::PerPeer(keys)) => keys,
                other => panic!("{other:?}"),
            };
        let (zero, one, two) = (per_peer(0), per_peer(1), per_peer(2));
        assert_eq!(zero.get(&1), one.get(&0));
        assert_eq!(one.get(&2), two.get(&1));
        assert_eq!(zero.get(&2), two.get(&0));
        assert_ne!(zero.get(&1), zero.get(&2));
        assert_eq!(zero.keys().copied().collect::<Vec<_>>(), [1, 2]);
        // Without a secret, the keys suffice for a cluster of three.
        let keyed = ClusterSettings {
            secret: None,
            member_keys_file: Some(dir.path().join("member-0.keys")),
            node_id: 0,
            ..three()
        };
        keyed.read_secret().unwrap();
        for (text, why) in [
            (
                "0 00112233445566778899aabbccddeeff\n",
                "no key for member 2",
            ),
            (
                "0 0011\n2 00112233445566778899aabbccddeeff\n",
                "hex of 16 bytes",
            ),
            (
                "0 zz112233445566778899aabbccddeeff\n2 00112233445566778899aabbccddeeff\n",
                "hex of 16 bytes",
            ),
            ("zero 00112233445566778899aabbccddeeff\n", "not a member id"),
        ] {
            let err = keys_of(1, text).unwrap_err().to_string();
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }

    #[test]
    fn a_cluster_table_is_checked_whole() {
        let ok = three();
        ok.check().unwrap();
        assert_eq!(ok.this_member().unwrap().client_addr.port(), 7071);
        assert_eq!(ok.read_secret().unwrap().unwrap().len(), 16);
        let broken = |change: &dyn Fn(&mut ClusterSettings)| {
            let mut c = three();
            change(&mut c);
            c.check().is_err() || c.read_secret().is_err()
        };
        assert!(broken(&|c| c.id = String::new()));
        assert!(broken(&|c| c.id = "a b".into()));
        assert!(broken(&|c| c.node_id = 3), "not a member");
        assert!(broken(&|c| c.members[2].id = 5), "ids not 0..n");
        assert!(broken(&|c| c.members[2].id = 1), "an id twice");
        assert!(broken(
            &|c| c.members[2].replica_addr = c.members[0].replica_addr
        ));
        assert!(broken(&|c| c.links_per_peer = 0));
        assert!(broken(&|c| c.heartbeat_timeout_ms = 10));
        assert!(broken(&|c| c.heartbeat_timeout_ms = u64::MAX));
        assert!(
            broken(&|c| c.secret = None),
            "three members without a secret"
        );
        assert!(broken(&|c| c.secret = Some(Secret("short".into()))));
        assert!(parse_members("0=127.0.0.1:1").is_err());
        assert!(parse_members("x=127.0.0.1:1/127.0.0.1:2").is_err());
        assert_ne!(
            three().bus_cluster_id(),
            ClusterSettings::default().bus_cluster_id()
        );
    }
}
