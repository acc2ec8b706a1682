#!/usr/bin/env bash
# Damage at rest in real processes (issue 24): one member of a 3-node cluster on
# loopback is stopped, one kind of file of its data directory gets a flipped bit (then,
# in a second pass, is deleted), and it is started again; every kind in turn (segment,
# offset and time index, recovery point, vsr.journal, checkpoints, states tables, the
# metadata journal). After each round every acknowledged record must be read back at
# its offset; at the end every member's logs must be the same on disk. Prints a table
# of what each damage led to (repaired, or refused with the reason). About 5 minutes.
#
#   scripts/damage-suite.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test -p braid-cli --release --test damage_suite -- --ignored --nocapture --test-threads 1
