#!/usr/bin/env bash
# The long simulator runs, not part of CI.
#
#   scripts/sim-soak.sh [SEEDS] [FROM]           the VSR core over the model disk:
#                                                200,000 seeds by default (about 20
#                                                minutes on 2 cores), one summary line
#   scripts/sim-soak.sh --shell [SEEDS] [FROM]   the node's replication shell on real
#                                                files (crates/node/src/replication/
#                                                shell_sim.rs): 10,000 seeds by default
#                                                (about 15 minutes on 2 cores)
#   scripts/sim-soak.sh --shell-damage [SEEDS] [FROM]
#                                                as --shell, and one member's files
#                                                damaged at rest after its power losses
#   BRAID_SHELL_SIM_MEMBERS=5 BRAID_SHELL_SIM_FAULTS=4 scripts/sim-soak.sh --shell...
#                                                the same with five members and four
#                                                times the crashes, cuts and frame faults
#   BRAID_SHELL_SIM_MISDIRECTED=1 scripts/sim-soak.sh --shell-damage ...
#                                                damage at rest also as misdirected
#                                                writes (a page over another page)
#   BRAID_SHELL_SIM_LATENT=1 scripts/sim-soak.sh --shell-damage ...
#                                                damage at rest also as latent read
#                                                errors (a page no read can get)
#   BRAID_SHELL_SIM_RETENTION=1 scripts/sim-soak.sh --shell...
#                                                retention by size in every seed (a
#                                                third of the seeds run it anyway)
#   BRAID_SHELL_SIM_DESCRIPTORS=1 scripts/sim-soak.sh --shell...
#                                                now and then one member out of file
#                                                descriptors for a while (EMFILE on
#                                                every open of its partitions' files)
#   scripts/sim-soak.sh --shell-asleep [SEEDS] [FROM]
#                                                as --shell-damage, and damage to
#                                                sleeping partitions' files while the
#                                                member runs (or add
#                                                BRAID_SHELL_SIM_ASLEEP_DAMAGE=1 to any
#                                                --shell-damage run)
#
# Each failure prints its seed; replay one with its trace:
#   target/release/braid-sim --seed N --trace
#   BRAID_SHELL_SIM_SEED=N BRAID_SHELL_SIM_TRACE=1 BRAID_LOG=braid_node::replication=trace \
#     cargo test --release -p braid-node --lib replay_one_seed -- --ignored --nocapture
# (with BRAID_SHELL_SIM_DAMAGE=1 for a --shell-damage seed, and also
# BRAID_SHELL_SIM_ASLEEP_DAMAGE=1 for a --shell-asleep one, and the MEMBERS and FAULTS
# it ran with)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"
case "${1:-}" in
  --shell | --shell-damage | --shell-asleep)
    test=the_shell_keeps_every_acknowledged_record
    [[ "$1" == "--shell-damage" ]] && test=damage_at_rest_on_one_member
    [[ "$1" == "--shell-asleep" ]] && test=damage_to_sleeping_files
    shift
    export BRAID_SHELL_SIM_SEEDS="${1:-10000}"
    export BRAID_SHELL_SIM_FROM="${2:-1}"
    export BRAID_SHELL_SIM_JOBS="$jobs"
    exec cargo test --release -p braid-node --lib "replication::shell_sim::tests::$test" \
      -- --include-ignored --nocapture
    ;;
esac
seeds="${1:-200000}"
from="${2:-1}"
cargo build --release -p braid-sim
exec target/release/braid-sim --seeds "$seeds" --from "$from" --jobs "$jobs"
