#!/usr/bin/env bash
# The storage fault-injection harness at length: N workloads (default 200), each run
# once per disk operation it performs with that one operation failing, first with EIO
# and then with ENOSPC; every run must reopen with every acknowledged record. CI runs a
# small sample of the same harness inside `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
STORAGE_FAULTS_ROUNDS="${1:-200}" cargo test -p braid-storage --release --lib \
  many_workloads_with_every_operation_failed -- --ignored --nocapture
