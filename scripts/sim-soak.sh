#!/usr/bin/env bash
# The long simulator run: 200,000 seeds (or $1) on every core, one summary. Each failure
# prints its seed and the replay command. Not part of CI (about 20 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
seeds="${1:-200000}"
from="${2:-1}"
jobs="$(nproc)"
cargo build --release -p braid-sim
exec target/release/braid-sim --seeds "$seeds" --from "$from" --jobs "$jobs"
