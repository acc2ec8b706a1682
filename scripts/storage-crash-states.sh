#!/usr/bin/env bash
# The storage crash-state harness at length: N traced workloads (default 200); at each
# sync boundary of each, every state a power cut may leave under the POSIX model is
# rebuilt and opened with the real recovery code, which must keep every acknowledged
# record. CI runs three workloads of the same harness inside `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
STORAGE_CRASH_ROUNDS="${1:-200}" cargo test -p braid-storage --release --lib \
  many_workloads_crash_states -- --ignored --nocapture
