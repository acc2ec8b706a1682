//! Which boot of the machine a group's durable state was written in.
//!
//! Under `fsync = interval` or `never` a partition reports journal writes before they
//! are synced. A process crash keeps them (they sit in the kernel's page cache); a power
//! loss or a reboot may not. So each group's entry in the states file is stamped with
//! the boot it was written in ([`Stamp`]), and a restart trusts a group's journal only
//! when the stamp is this boot's, or says every write was synced at a clean stop. A
//! group that starts untrusted writes its reduced trust with this boot's stamp on its
//! first turn; until that write lands its old stamp stands, so a crash in between
//! restarts it untrusted again. The simulator models the same rule (its shell "keeps
//! the boot id with the durable state").

use std::sync::OnceLock;

/// Linux's random id of the running boot, fresh at every boot.
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// The id of one boot of the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BootId([u8; 16]);

impl BootId {
    /// The running boot's id, read once per process. Where the kernel does not say, a
    /// random id: no later process matches it, so every restart is treated as a reboot
    /// (untrusted), which is safe.
    pub(crate) fn current() -> Self {
        static CURRENT: OnceLock<BootId> = OnceLock::new();
        *CURRENT.get_or_init(|| {
            match std::fs::read_to_string(BOOT_ID_PATH)
                .ok()
                .and_then(|text| Self::parse(&text))
            {
                Some(id) => id,
                None => {
                    tracing::warn!(
                        path = BOOT_ID_PATH,
                        "the boot id is unreadable: every restart counts as a reboot, so \
                         partitions under fsync = interval or never restart untrusted"
                    );
                    let mut bytes = [0u8; 16];
                    if crate::admin_bootstrap::random_bytes(&mut bytes).is_err() {
                        // No randomness either: this process's id and start time.
                        let nanos = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_nanos() as u64);
                        bytes[..8].copy_from_slice(&nanos.to_be_bytes());
                        bytes[8..12].copy_from_slice(&std::process::id().to_be_bytes());
                    }
                    Self::from_bytes(bytes)
                }
            }
        })
    }

    /// An id from its 16 bytes (never one of the reserved stamps).
    pub(crate) fn from_bytes(mut bytes: [u8; 16]) -> Self {
        if bytes == [0; 16] || bytes == [0xff; 16] {
            bytes[0] ^= 0x5a;
        }
        Self(bytes)
    }

    /// Parses the kernel's text form (a UUID: 32 hex digits and dashes).
    fn parse(text: &str) -> Option<Self> {
        let digits: Vec<u8> = text
            .trim()
            .bytes()
            .filter(|b| *b != b'-')
            .map(|b| (b as char).to_digit(16).map(|d| d as u8))
            .collect::<Option<_>>()?;
        if digits.len() != 32 {
            return None;
        }
        let mut bytes = [0u8; 16];
        for (byte, pair) in bytes.iter_mut().zip(digits.chunks_exact(2)) {
            *byte = pair[0] << 4 | pair[1];
        }
        Some(Self::from_bytes(bytes))
    }
}

/// What a group's entry in the states file says about its journal's unsynced writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stamp {
    /// Written by a build that kept no stamp, or its journal failed to close: trust
    /// nothing unsynced.
    Unknown,
    /// Written in this boot: unsynced writes since are in the page cache if the machine
    /// has not rebooted.
    Boot(BootId),
    /// Written at a clean stop, after the group's journal was synced and closed: every
    /// write is on disk, whatever boot comes next.
    Synced,
}

impl Stamp {
    /// Bytes of a stamp on disk.
    pub(crate) const BYTES: usize = 16;

    pub(crate) fn encode(self) -> [u8; Self::BYTES] {
        match self {
            Self::Unknown => [0; 16],
            Self::Boot(id) => id.0,
            Self::Synced => [0xff; 16],
        }
    }

    pub(crate) fn decode(bytes: [u8; Self::BYTES]) -> Self {
        match bytes {
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0] => Self::Unknown,
            b if b == [0xff; 16] => Self::Synced,
            b => Self::Boot(BootId(b)),
        }
    }

    /// Whether a journal whose state carries this stamp kept every write it reported,
    /// for a process started in boot `now`.
    pub(crate) fn vouches_in(self, now: BootId) -> bool {
        match self {
            Self::Unknown => false,
            Self::Boot(id) => id == now,
            Self::Synced => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_boot_id_parses_and_stamps_round_trip() {
        let id = BootId::parse("64369f55-f14e-4b37-9dd0-6ee642e9e206\n").unwrap();
        assert_eq!(id.0[0], 0x64);
        assert_eq!(id.0[15], 0x06);
        assert!(BootId::parse("64369f55").is_none());
        assert!(BootId::parse("zz369f55-f14e-4b37-9dd0-6ee642e9e206").is_none());
        for stamp in [Stamp::Unknown, Stamp::Synced, Stamp::Boot(id)] {
            assert_eq!(Stamp::decode(stamp.encode()), stamp);
        }
        // A boot id that collides with a reserved stamp is moved off it.
        assert_eq!(
            Stamp::decode(Stamp::Boot(BootId::from_bytes([0; 16])).encode()),
            Stamp::Boot(BootId::from_bytes([0; 16]))
        );
        let other = BootId::from_bytes([7; 16]);
        assert!(Stamp::Boot(id).vouches_in(id));
        assert!(!Stamp::Boot(id).vouches_in(other));
        assert!(Stamp::Synced.vouches_in(other));
        assert!(!Stamp::Unknown.vouches_in(id));
        // This machine says which boot it is in, and says it the same way twice.
        assert_eq!(BootId::current(), BootId::current());
    }
}
