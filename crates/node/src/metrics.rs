//! Counters of a node, kept per shard (no shared cache line on the hot path) and summed
//! when `/metrics` is scraped, in the Prometheus text format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use braid_proto::client::{Command, ErrorCode};

/// One shard's counters.
#[derive(Debug)]
pub(crate) struct ShardMetrics {
    requests: Vec<AtomicU64>,
    errors: Vec<AtomicU64>,
    pub(crate) connections_active: AtomicU64,
    pub(crate) connections_total: AtomicU64,
    pub(crate) produce_records: AtomicU64,
    pub(crate) produce_bytes: AtomicU64,
    pub(crate) fetch_bytes: AtomicU64,
    pub(crate) partitions: AtomicU64,
    pub(crate) fsyncs_requested: AtomicU64,
    pub(crate) state_transfers: AtomicU64,
    pub(crate) batches_repaired: AtomicU64,
    /// A gauge, stored by the shard each tick.
    pub(crate) partitions_awaiting_repair: AtomicU64,
    pub(crate) files_slept: AtomicU64,
    pub(crate) files_woken: AtomicU64,
    pub(crate) files_released_over_budget: AtomicU64,
    pub(crate) opens_without_descriptors: AtomicU64,
    pub(crate) resends_answered: AtomicU64,
    pub(crate) retirement_barriers: AtomicU64,
    pub(crate) retirement_debt: AtomicU64,
    pub(crate) retirement_unproven: AtomicU64,
    pub(crate) finalize_ops: AtomicU64,
    pub(crate) repair_prepares_requested: AtomicU64,
    pub(crate) repair_snapshots_requested: AtomicU64,
    pub(crate) frames_refused: AtomicU64,
    pub(crate) partitions_poisoned: AtomicU64,
    pub(crate) partitions_refused: AtomicU64,
    pub(crate) connection_reads_paused: AtomicU64,
    pub(crate) fetch_budget_waits: AtomicU64,
    pub(crate) connections_closed_stalled: AtomicU64,
    pub(crate) fetch_waits_refused: AtomicU64,
    pub(crate) connections_closed_deadline: AtomicU64,
    pub(crate) logins_ended: AtomicU64,
    pub(crate) logins_refused_per_user: AtomicU64,
    pub(crate) layout_changes: AtomicU64,
    pub(crate) layout_rebuilds: AtomicU64,
    pub(crate) strangers_refused: AtomicU64,
    pub(crate) logins_delayed: AtomicU64,
    pub(crate) frame_budget_waits: AtomicU64,
    pub(crate) connections_refused: AtomicU64,
    pub(crate) authentication_failures: AtomicU64,
    pub(crate) authentications: AtomicU64,
    pub(crate) permission_denials: AtomicU64,
    pub(crate) tls_handshake_failures: AtomicU64,
}

impl Default for ShardMetrics {
    fn default() -> Self {
        let zeros = |n: usize| (0..n).map(|_| AtomicU64::new(0)).collect();
        Self {
            requests: zeros(Command::ALL.len()),
            errors: zeros(ErrorCode::ALL.len()),
            connections_active: AtomicU64::new(0),
            connections_total: AtomicU64::new(0),
            produce_records: AtomicU64::new(0),
            produce_bytes: AtomicU64::new(0),
            fetch_bytes: AtomicU64::new(0),
            partitions: AtomicU64::new(0),
            fsyncs_requested: AtomicU64::new(0),
            state_transfers: AtomicU64::new(0),
            batches_repaired: AtomicU64::new(0),
            partitions_awaiting_repair: AtomicU64::new(0),
            files_slept: AtomicU64::new(0),
            files_woken: AtomicU64::new(0),
            files_released_over_budget: AtomicU64::new(0),
            opens_without_descriptors: AtomicU64::new(0),
            resends_answered: AtomicU64::new(0),
            retirement_barriers: AtomicU64::new(0),
            retirement_debt: AtomicU64::new(0),
            retirement_unproven: AtomicU64::new(0),
            finalize_ops: AtomicU64::new(0),
            repair_prepares_requested: AtomicU64::new(0),
            repair_snapshots_requested: AtomicU64::new(0),
            frames_refused: AtomicU64::new(0),
            partitions_poisoned: AtomicU64::new(0),
            partitions_refused: AtomicU64::new(0),
            connection_reads_paused: AtomicU64::new(0),
            fetch_budget_waits: AtomicU64::new(0),
            connections_closed_stalled: AtomicU64::new(0),
            fetch_waits_refused: AtomicU64::new(0),
            connections_closed_deadline: AtomicU64::new(0),
            logins_ended: AtomicU64::new(0),
            logins_refused_per_user: AtomicU64::new(0),
            layout_changes: AtomicU64::new(0),
            layout_rebuilds: AtomicU64::new(0),
            strangers_refused: AtomicU64::new(0),
            logins_delayed: AtomicU64::new(0),
            frame_budget_waits: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            authentication_failures: AtomicU64::new(0),
            authentications: AtomicU64::new(0),
            permission_denials: AtomicU64::new(0),
            tls_handshake_failures: AtomicU64::new(0),
        }
    }
}

pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl ShardMetrics {
    pub(crate) fn request(&self, command: Command) {
        if let Some(i) = Command::ALL.iter().position(|c| *c == command) {
            add(&self.requests[i], 1);
        }
    }

    pub(crate) fn error(&self, code: ErrorCode) {
        if let Some(i) = ErrorCode::ALL.iter().position(|c| *c == code) {
            add(&self.errors[i], 1);
        }
    }
}

/// Renders the sum over shards in the Prometheus text exposition format.
pub(crate) fn render(
    shards: &[Arc<ShardMetrics>],
    bus: Option<&braid_bus::BusView>,
    groups: &crate::replication::status::Summary,
) -> String {
    let sum = |f: &dyn Fn(&ShardMetrics) -> &AtomicU64| -> u64 {
        shards.iter().map(|s| f(s).load(Ordering::Relaxed)).sum()
    };
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    };
    metric(
        "braid_connections_active",
        "gauge",
        "Open client connections.",
        sum(&|s| &s.connections_active),
    );
    metric(
        "braid_connections_total",
        "counter",
        "Client connections accepted.",
        sum(&|s| &s.connections_total),
    );
    metric(
        "braid_produce_records_total",
        "counter",
        "Records appended.",
        sum(&|s| &s.produce_records),
    );
    metric(
        "braid_produce_bytes_total",
        "counter",
        "Batch bytes appended.",
        sum(&|s| &s.produce_bytes),
    );
    metric(
        "braid_fetch_bytes_total",
        "counter",
        "Batch bytes served to consumers.",
        sum(&|s| &s.fetch_bytes),
    );
    metric(
        "braid_partitions",
        "gauge",
        "Partitions open on this node.",
        sum(&|s| &s.partitions),
    );
    metric(
        "braid_partitions_poisoned_total",
        "counter",
        "Partitions that refused writes after a failed disk operation (until restart).",
        sum(&|s| &s.partitions_poisoned),
    );
    metric(
        "braid_partitions_refused",
        "gauge",
        "Partitions of a single node refused at start: their files hold damage no peer can repair (each logged at error with the file and offset).",
        sum(&|s| &s.partitions_refused),
    );
    metric(
        "braid_connection_reads_paused_total",
        "counter",
        "Times a connection's socket stopped being read: it had connection_requests_max requests or connection_fetch_bytes_max fetch bytes in flight.",
        sum(&|s| &s.connection_reads_paused),
    );
    metric(
        "braid_fetch_budget_waits_total",
        "counter",
        "Fetches that waited for the node's fetch_bytes_max budget.",
        sum(&|s| &s.fetch_budget_waits),
    );
    metric(
        "braid_connections_closed_stalled_total",
        "counter",
        "Connections closed because their answers made no progress for connection_write_timeout_ms.",
        sum(&|s| &s.connections_closed_stalled),
    );
    metric(
        "braid_fetch_waits_refused_total",
        "counter",
        "Fetches answered at once because their connection had connection_waiting_fetches_max parked.",
        sum(&|s| &s.fetch_waits_refused),
    );
    metric(
        "braid_connections_closed_deadline_total",
        "counter",
        "Connections closed for no first frame, a frame not completed, or idleness in time.",
        sum(&|s| &s.connections_closed_deadline),
    );
    metric(
        "braid_connections_refused_unauthenticated_total",
        "counter",
        "Connections closed at accept because the node, or their source address, held its maximum of connections not logged in.",
        sum(&|s| &s.strangers_refused),
    );
    metric(
        "braid_frame_budget_waits_total",
        "counter",
        "Large client frames whose reading waited for the node's frame_bytes_in_flight_max.",
        sum(&|s| &s.frame_budget_waits),
    );
    metric(
        "braid_logins_delayed_total",
        "counter",
        "Logins made to wait because their source address or user had recent failures.",
        sum(&|s| &s.logins_delayed),
    );
    metric(
        "braid_logins_ended_total",
        "counter",
        "Connections closed because their user was deleted or its password changed.",
        sum(&|s| &s.logins_ended),
    );
    metric(
        "braid_layout_changes_total",
        "counter",
        "Metadata changes published to the shards as what they touched.",
        sum(&|s| &s.layout_changes),
    );
    metric(
        "braid_layout_rebuilds_total",
        "counter",
        "Whole layouts published to the shards (at start and after a metadata checkpoint was installed).",
        sum(&|s| &s.layout_rebuilds),
    );
    metric(
        "braid_logins_refused_per_user_total",
        "counter",
        "Logins refused because their user held connections_per_user_max connections.",
        sum(&|s| &s.logins_refused_per_user),
    );
    metric(
        "braid_connections_refused_total",
        "counter",
        "Connections closed at accept because the node already served connections_max.",
        sum(&|s| &s.connections_refused),
    );
    metric(
        "braid_authentications_total",
        "counter",
        "Connections that authenticated.",
        sum(&|s| &s.authentications),
    );
    metric(
        "braid_authentication_failures_total",
        "counter",
        "Logins refused (wrong password, unknown user, malformed or unsupported exchange); each closed its connection.",
        sum(&|s| &s.authentication_failures),
    );
    metric(
        "braid_permission_denials_total",
        "counter",
        "Requests refused with NotAuthenticated or PermissionDenied.",
        sum(&|s| &s.permission_denials),
    );
    metric(
        "braid_tls_handshake_failures_total",
        "counter",
        "Client connections closed because their TLS handshake failed or did not finish within connection_first_frame_ms.",
        sum(&|s| &s.tls_handshake_failures),
    );
    metric(
        "braid_fsync_requests_total",
        "counter",
        "Partition journal syncs sent to the sync thread (fsync = always).",
        sum(&|s| &s.fsyncs_requested),
    );
    metric(
        "braid_partition_state_transfers_total",
        "counter",
        "Partition logs copied from a peer up to a checkpoint this replica installed (it was behind every peer's journal, or its log lost batches).",
        sum(&|s| &s.state_transfers),
    );
    metric(
        "braid_partition_damage_repaired_total",
        "counter",
        "Damaged batches of a partition log (found by the scrub of committed batches, by a read for a peer, or by a start: an op whose journal record or batch the open found damaged) written over with a peer's copy.",
        sum(&|s| &s.batches_repaired),
    );
    metric(
        "braid_partitions_awaiting_repair",
        "gauge",
        "Partitions whose log holds a damaged batch no peer's copy has mended yet (nothing is served past it meanwhile). Above 0 for more than a minute, a repair is stuck: every peer's copy is damaged or gone; the log says at which offset.",
        sum(&|s| &s.partitions_awaiting_repair),
    );
    metric(
        "braid_partition_files_slept_total",
        "counter",
        "Times a partition's journal and log were closed and let go from memory (after 1 to 2 seconds unused, or past the shard's budget of awake partitions; reopened by the next use).",
        sum(&|s| &s.files_slept),
    );
    metric(
        "braid_partition_files_woken_total",
        "counter",
        "Times a partition's sleeping journal and log were opened again (a write, a read, the scrub, a peer's copy), each checked to be as it was left.",
        sum(&|s| &s.files_woken),
    );
    metric(
        "braid_partition_files_released_total",
        "counter",
        "Times a partition's file descriptors were let go because more than open_logs_per_shard partitions of its shard used their files (the least recently used goes; its next use opens them again). Rising steadily, the shard's working set is larger than its budget: raise open_logs_per_shard with the descriptor limit.",
        sum(&|s| &s.files_released_over_budget),
    );
    metric(
        "braid_partition_opens_without_descriptors_total",
        "counter",
        "Times a partition's files could not be opened (woken or opened again) for want of a file descriptor (EMFILE, ENFILE): that partition answers Busy and is opened again every 250 ms until it can be, while the others serve. Above 0, raise the descriptor limit (`ulimit -n`) or lower open_logs_per_shard.",
        sum(&|s| &s.opens_without_descriptors),
    );
    metric(
        "braid_produce_resends_answered_total",
        "counter",
        "Produces of a client session's request the partition had stored already (a producer's resend after a timeout, a lost connection or a failover), answered with the offsets it was stored at and not stored again.",
        sum(&|s| &s.resends_answered),
    );
    metric(
        "braid_retirement_barriers_total",
        "counter",
        "Retirement barriers this node's partition primaries proposed: each forgets ended client sessions' entries in one partition (at most 128 sessions) so the metadata can retire them.",
        sum(&|s| &s.retirement_barriers),
    );
    metric(
        "braid_retirement_debt_copies_total",
        "counter",
        "Partition copies a walk retiring ended client sessions could not prove for 2 s (no primary, a backup behind its primary) and reported as debt: such a partition takes no new session until a barrier catches it up.",
        sum(&|s| &s.retirement_debt),
    );
    metric(
        "braid_retirement_copies_unproven",
        "gauge",
        "Partition copies on this node that the running walk retiring ended client sessions has not proven yet (0 between walks).",
        sum(&|s| &s.retirement_unproven),
    );
    metric(
        "braid_sessions_finalize_ops_total",
        "counter",
        "FinalizeSession ops this node committed as the coordinator: each retires (forgets) every client session ended at or below its op.",
        sum(&|s| &s.finalize_ops),
    );
    metric(
        "braid_disk_unreadable_sectors_total",
        "counter",
        "Sector reads the disk failed (EIO, a latent sector error), each read as zeros: damage to what the sector held, repaired from a peer or refused. A disk that fails them is failing.",
        braid_storage::disk::unreadable_sectors(),
    );
    metric(
        "braid_vsr_repair_prepares_requested_total",
        "counter",
        "Prepares this node's replicas asked of peers (an entry missing or damaged here).",
        sum(&|s| &s.repair_prepares_requested),
    );
    metric(
        "braid_vsr_repair_snapshots_requested_total",
        "counter",
        "Snapshots this node's replicas asked of peers (ops no peer's journal still holds).",
        sum(&|s| &s.repair_snapshots_requested),
    );
    for (name, kind, help, value) in [
        (
            "braid_vsr_groups",
            "gauge",
            "Replication groups on this node (the metadata and every partition).",
            groups.groups,
        ),
        (
            "braid_vsr_groups_led",
            "gauge",
            "Groups this node leads (primary, normal status).",
            groups.led,
        ),
        (
            "braid_vsr_groups_in_view_change",
            "gauge",
            "Groups choosing a new view or recovering.",
            groups.in_view_change,
        ),
        (
            "braid_vsr_groups_behind",
            "gauge",
            "Groups not caught up: not in normal status, or committed ops not yet applied.",
            groups.behind,
        ),
        (
            "braid_shards_stopped",
            "gauge",
            "Shards whose partition groups stopped after a failed disk operation (a full disk, an IO error): they serve none of their partitions until the node restarts.",
            groups.shards_stopped,
        ),
        (
            "braid_vsr_commit_lag_ops",
            "gauge",
            "Committed ops known and not yet applied, summed over groups.",
            groups.commit_lag,
        ),
        (
            "braid_vsr_view_changes_total",
            "counter",
            "Views the groups passed since start, as their shards saw them every 100 ms.",
            groups.views_passed,
        ),
        (
            "braid_vsr_step_downs_total",
            "counter",
            "Primaries on this node that stepped down because their prepares committed nothing for twice the view-change timeout (cut off from their quorum).",
            groups.step_downs,
        ),
    ] {
        metric(name, kind, help, value);
    }
    metric(
        "braid_frames_refused_total",
        "counter",
        "Frames refused: oversize or unframeable; the connection was closed.",
        sum(&|s| &s.frames_refused),
    );
    if let Some(view) = bus {
        let bus = view.metrics();
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let handshake_failures = bus
            .handshake_failures
            .lock()
            .map_or(0, |failures| failures.values().sum());
        for (name, help, value) in [
            (
                "braid_bus_bundles_up_total",
                "Replica bus bundles that came up (every link to a peer established).",
                load(&bus.bundles_up),
            ),
            (
                "braid_bus_teardowns_total",
                "Bundles torn down (a link closed, or a bundle incomplete past its grace).",
                load(&bus.teardowns),
            ),
            (
                "braid_bus_preamble_refusals_total",
                "Replica connections refused at their preamble.",
                load(&bus.preamble_refusals),
            ),
            (
                "braid_bus_handshake_failures_total",
                "Replica handshakes that failed (a bad MAC, a disagreeing hello, TLS, a deadline).",
                handshake_failures,
            ),
            (
                "braid_bus_frames_dropped_total",
                "Frames dropped at a full peer queue (consensus retransmits them).",
                load(&bus.frames_dropped),
            ),
            (
                "braid_bus_frames_sent_total",
                "Frames written to replica links.",
                load(&bus.frames_sent),
            ),
            (
                "braid_bus_frames_received_total",
                "Frames read from replica links.",
                load(&bus.frames_received),
            ),
        ] {
            metric(name, "counter", help, value);
        }
        let _ = writeln!(
            out,
            "# HELP braid_bus_peer_up Whether the bundle to a peer is whole (1) or down (0).\n# TYPE braid_bus_peer_up gauge"
        );
        for peer in view.peers() {
            let _ = writeln!(
                out,
                "braid_bus_peer_up{{peer=\"{}\"}} {}",
                peer.peer,
                u8::from(peer.bundle_up)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP braid_requests_total Requests by command.\n# TYPE braid_requests_total counter"
    );
    for (i, command) in Command::ALL.iter().enumerate() {
        let value: u64 = shards
            .iter()
            .map(|s| s.requests[i].load(Ordering::Relaxed))
            .sum();
        let _ = writeln!(
            out,
            "braid_requests_total{{command=\"{}\"}} {value}",
            command.name()
        );
    }
    let _ = writeln!(
        out,
        "# HELP braid_errors_total Error responses by code.\n# TYPE braid_errors_total counter"
    );
    for (i, code) in ErrorCode::ALL.iter().enumerate() {
        let value: u64 = shards
            .iter()
            .map(|s| s.errors[i].load(Ordering::Relaxed))
            .sum();
        let _ = writeln!(
            out,
            "braid_errors_total{{code=\"{}\"}} {value}",
            code.name()
        );
    }
    out
}
