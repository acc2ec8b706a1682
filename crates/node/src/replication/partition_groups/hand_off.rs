//! Leadership spreads back after failovers (issue 24, finding 8): every partition
//! group prefers the member that leads its view 0 (groups spread over the members by
//! group id), and a shard that leads a group it is not preferred for hands it back
//! once that member holds the whole log, as Kafka's preferred leader election does.
//! The protocol part (when a primary may hand off, and to which view) is the core's
//! [`Input::HandOff`]; this is the policy: how often, and how many at once.

use braid_vsr::Input;

use super::{HostError, Moved, PartitionGroups};

/// How often (ticks) the shard looks for groups to hand back: 5 s at 10 ms a tick, so
/// a member that came back leads its share again within seconds, not at once.
const HAND_OFF_TICKS: u64 = 500;
/// Groups handed back per look: each costs its group one election, so a member that
/// comes back to a thousand partitions takes them over some minutes.
const HAND_OFFS_PER_LOOK: usize = 16;

impl PartitionGroups {
    /// Hands groups back to their preferred members, a few at a time (see the module).
    pub(super) fn hand_back(&mut self, moved: &mut Moved) {
        if self.members <= 1 || !self.now.is_multiple_of(HAND_OFF_TICKS) {
            return;
        }
        let inputs: Vec<(u64, Input)> = self
            .host
            .replicas()
            .filter(|r| r.may_hand_off())
            .take(HAND_OFFS_PER_LOOK)
            .map(|r| (r.config().group, Input::HandOff))
            .collect();
        if inputs.is_empty() {
            return;
        }
        tracing::debug!(
            groups = inputs.len(),
            "handing groups back to their preferred members"
        );
        match self.host.step(self.now, inputs) {
            Ok(effects) => self.carry(effects, moved),
            Err(HostError::UnknownGroup(_)) => {}
            Err(err) => self.fail(err),
        }
    }
}
