#!/usr/bin/env bash
# The long real-process fault runs of a 3-node cluster on loopback (about 5 minutes
# on 2 cores): 20 SIGKILLs of the partition's primary under four producers (p50 and max
# time to the first acknowledgement after each kill), rolling restarts under fsync =
# never (SIGTERM, then SIGKILL, one member at a time), and SIGKILL
# of all three at once under fsync = always. Each checks every acknowledged record is
# read back at its offset, counts records stored twice, and compares each group's
# commit point (op and checksum) across the members.
#
#   scripts/fault-suite.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test -p braid-cli --release --test fault_suite -- --ignored --nocapture --test-threads 1
