#!/usr/bin/env bash
# Two `braid` binaries (say, the previous commit's and this one's) on the same
# embedded workload, interleaved ROUNDS times so drift on a shared machine hits both
# alike; prints each run's produce MB/s, ack p99 (µs) and MB produced per CPU second
# (user + sys of the whole bench process), the medians, and B/A. On a shared machine
# whose neighbours steal cycles, MB per CPU second is the steadier of the two.
#
#   scripts/bench-compare.sh BRAID_A BRAID_B [ROUNDS] [PRESET] [SECONDS]
#
# BENCH_DIR=/dev/shm puts the data directories on tmpfs: the comparison then weighs
# the code's CPU cost alone, not a shared disk's writeback stalls. BENCH_ARGS adds
# options to every run (BENCH_ARGS="--members 3": an embedded 3-node cluster).
#
# Build the older one with a worktree and its own target directory, e.g.
#   git worktree add /tmp/base <commit> && (cd /tmp/base && CARGO_TARGET_DIR=/tmp/base-target cargo build --release -p braid-cli)
set -euo pipefail
A="$1"; B="$2"; ROUNDS="${3:-3}"; PRESET="${4:-throughput-1kb}"; SECONDS_PER_RUN="${5:-10}"
WORK="$(mktemp -d -p "${BENCH_DIR:-${TMPDIR:-/tmp}}")"; trap 'rm -rf "$WORK"' EXIT
run() { # run BINARY -> "MB/s p99_us MB_per_cpu_s"
  rm -rf "$WORK/data"; mkdir -p "$WORK/data"
  local cpu
  # shellcheck disable=SC2086 # BENCH_ARGS is a list of options
  cpu="$( { /usr/bin/time -f "%U %S" "$1" bench "$PRESET" --embedded ${BENCH_ARGS:-} --data-dir "$WORK/data" \
    --duration "$SECONDS_PER_RUN" --json "$WORK/r.json" > /dev/null; } 2>&1 | tail -1)"
  python3 - "$WORK/r.json" $cpu <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); cpu = float(sys.argv[2]) + float(sys.argv[3])
latency = r.get("ack_latency") or {}
# Everything the process produced (warm-up included) against all the CPU it used.
produced = sum(s["produced"] for s in r["timeline"]) * r["workload"]["record_bytes"]
print(r["produce"]["mb_per_sec"], latency.get("p99_us", "nan"), produced / 1e6 / cpu)
PY
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
for i, name in [(0, "MB/s"), (1, "ack p99 us"), (2, "MB per CPU s")]:
    ma = statistics.median(float(x[i]) for x in a); mb = statistics.median(float(x[i]) for x in b)
    print(f"{name}: A median {ma:.1f}, B median {mb:.1f}, B/A {mb / ma:.2f}")
PY
