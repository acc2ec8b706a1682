#!/usr/bin/env bash
# What one large admin request costs the data path: a single node (data on the real
# disk) runs `braid bench latency-1kb` for SECONDS seconds, and half-way in a topic of
# PARTITIONS partitions is created on another stream (the bench's probe and warm-up
# take the first seconds: keep SECONDS at 40 or more). Prints how long the create
# took, the run's produce ack percentiles, and the fewest records produced in any one
# second against the median second. With RATE (records/s), the bench is
# `end-to-end-1kb` at that fixed rate instead, producing and consuming at once, and the
# end-to-end (produce to fetch) percentiles are printed too.
#
#   scripts/create-under-load.sh [BRAID_BINARY] [PARTITIONS] [SECONDS] [RATE]
set -euo pipefail
braid=$(realpath "${1:-target/release/braid}")
partitions=${2:-10000}
seconds=${3:-40}
rate=${4:-}
if [ -n "$rate" ]; then
	workload=(end-to-end-1kb --rate "$rate" --warmup 2)
else
	workload=(latency-1kb)
fi
# Past the default quotas on purpose.
export BRAID_TOPIC_PARTITIONS_MAX=10000 BRAID_PARTITIONS_MAX=1000000 BRAID_PARTITIONS_PER_STREAM_MAX=1000000
# shellcheck source=lib/one-node.sh
source "$(dirname "$0")/lib/one-node.sh"
start_one_node create-under-load
"$braid" --addr "127.0.0.1:$port" bench "${workload[@]}" --duration "$seconds" \
	--json "$dir/report.json" >"$dir/bench.out" 2>&1 &
bench=$!
sleep $((seconds / 2))
"$braid" --addr "127.0.0.1:$port" stream create other >/dev/null 2>&1
start=$(date +%s.%N)
"$braid" --addr "127.0.0.1:$port" topic create other big --partitions "$partitions" >/dev/null 2>&1
took=$(echo "$(date +%s.%N) - $start" | bc)
wait "$bench" || { cat "$dir/bench.out"; exit 1; }
python3 - "$dir/report.json" "$partitions" "$took" ${SHOW_SECONDS:+1} <<'EOF'
import json, statistics, sys
report = json.load(open(sys.argv[1]))
ack = report["ack_latency"]
seconds = [s["produced"] for s in report["timeline"]]
print(f"a topic of {sys.argv[2]} partitions created in {float(sys.argv[3]):.2f} s during the run")
print(f"produce ack p50 {ack['p50_us']} us, p99 {ack['p99_us']} us, p99.9 {ack['p999_us']} us, max {ack['max_us']} us")
e2e = report.get("end_to_end_latency") or {}
if e2e.get("count"):
    print(f"end to end p50 {e2e['p50_us']} us, p99 {e2e['p99_us']} us, p99.9 {e2e['p999_us']} us, max {e2e['max_us']} us")
print(f"records per second: fewest {min(seconds)}, median {statistics.median(seconds)}")
if len(sys.argv) > 4: print(seconds)
EOF
