#!/usr/bin/env bash
# The long real-process fault runs of a 3-node cluster on loopback (every ignored
# test of crates/cli/tests/fault_suite.rs; about 8 minutes on 2 cores): 20 SIGKILLs
# of the partition's primary under four producers (p50 and max time to the first
# acknowledgement after each kill), rolling restarts under fsync = never (SIGTERM,
# then SIGKILL, one member at a time), SIGKILL of all three at once under fsync =
# always, and 24 SIGKILLs of any member under fsync = always with three producers on
# four partitions and a committing consumer group member (issue 24). Each checks
# every acknowledged record is read back at its partition and offset, counts records
# stored twice, compares each group's commit point (op and checksum) across the
# members, and after a clean stop compares each member's partition logs on disk,
# record by record.
#
#   scripts/fault-suite.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test -p braid-cli --release --test fault_suite -- --ignored --nocapture --test-threads 1
