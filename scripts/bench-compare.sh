#!/usr/bin/env bash
# Two `braid` binaries (say, the previous commit's and this one's) on the same
# embedded workload, interleaved ROUNDS times so drift on a shared machine hits both
# alike; prints each run's produce MB/s and ack p99 (µs), the medians, and B/A.
#
#   scripts/bench-compare.sh BRAID_A BRAID_B [ROUNDS] [PRESET] [SECONDS]
#
# Build the older one with a worktree and its own target directory, e.g.
#   git worktree add /tmp/base <commit> && (cd /tmp/base && CARGO_TARGET_DIR=/tmp/base-target cargo build --release -p braid-cli)
set -euo pipefail
A="$1"; B="$2"; ROUNDS="${3:-3}"; PRESET="${4:-throughput-1kb}"; SECONDS_PER_RUN="${5:-10}"
WORK="$(mktemp -d)"; trap 'rm -rf "$WORK"' EXIT
run() { # run BINARY -> "MB/s p99_ms"
  "$1" bench "$PRESET" --embedded --data-dir "$WORK" --duration "$SECONDS_PER_RUN" --json "$WORK/r.json" > /dev/null
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); l=r.get("ack_latency") or {}; print(r["produce"]["mb_per_sec"], l.get("p99_us", "nan"))' "$WORK/r.json"
}
RA=(); RB=()
for round in $(seq "$ROUNDS"); do
  a="$(run "$A")"; b="$(run "$B")"
  echo "round $round: A $a  B $b"
  RA+=("$a"); RB+=("$b")
done
python3 - "${RA[@]}" -- "${RB[@]}" <<'PY'
import statistics, sys
args = sys.argv[1:]; cut = args.index("--")
a = [x.split() for x in args[:cut]]; b = [x.split() for x in args[cut+1:]]
for i, name in [(0, "MB/s"), (1, "ack p99 us")]:
    ma = statistics.median(float(x[i]) for x in a); mb = statistics.median(float(x[i]) for x in b)
    print(f"{name}: A median {ma:.1f}, B median {mb:.1f}, B/A {mb / ma:.2f}")
PY
