#!/usr/bin/env bash
# Produce throughput of a 3-node cluster on this machine against an embedded single
# node, interleaved ROUNDS times in one run, and ack latency at half the rate the
# cluster sustained in the round's throughput run (a `--rate 50%` probe measures its
# maximum over a short fresh start, which a longer run does not keep). Prints each run
# and the medians.
#
# The cluster is `braid bench --embedded --members 3` (three nodes in the bench's
# process, started afresh for each run), or with CLUSTER=processes one
# `braid cluster local 3` (three child processes) that every run goes to by --addr.
#
# BENCH_ARGS adds options to every run (BENCH_ARGS="--in-flight 16").
#
#   [CLUSTER=embedded|processes] scripts/cluster-bench.sh [BRAID_BINARY] [ROUNDS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
braid=${1:-target/release/braid}
rounds=${2:-3}
seconds=${3:-10}
cluster_kind=${CLUSTER:-embedded}
dir=$(mktemp -d "${BENCH_DIR:-/tmp}/braid-cluster-bench.XXXXXX")
base=27070
addrs="127.0.0.1:$base,127.0.0.1:$((base + 1)),127.0.0.1:$((base + 2))"

case $cluster_kind in
embedded)
	trap 'rm -rf "$dir"' EXIT
	# shellcheck disable=SC2086 # BENCH_ARGS is a list of options
	three_nodes() { "$braid" bench --embedded --members 3 --data-dir "$dir" ${BENCH_ARGS:-} "$@"; }
	;;
processes)
	"$braid" cluster local 3 --base-port $base --data-dir "$dir/cluster" --fsync never >"$dir/cluster.out" 2>&1 &
	cluster=$!
	trap 'kill -INT $cluster 2>/dev/null || true; wait $cluster 2>/dev/null || true; rm -rf "$dir"' EXIT
	for i in 0 1 2; do
		until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((base + 10 + i))/ready" || true)" = 200 ]; do sleep 0.2; done
	done
	# shellcheck disable=SC2086
	three_nodes() { "$braid" --addr "$addrs" bench ${BENCH_ARGS:-} "$@"; }
	;;
*) echo "CLUSTER is embedded or processes, not $cluster_kind" >&2; exit 2 ;;
esac

field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$1" "$2"; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
: >"$dir/single" ; : >"$dir/three" ; : >"$dir/half_p50" ; : >"$dir/half_p99"
for round in $(seq "$rounds"); do
	mkdir -p "$dir/single-$round"
	# shellcheck disable=SC2086
	"$braid" bench --embedded --data-dir "$dir/single-$round" ${BENCH_ARGS:-} throughput-1kb --duration "$seconds" --json "$dir/s.json" >/dev/null
	single=$(field "$dir/s.json" "d['produce']['mb_per_sec']")
	rm -rf "$dir/single-$round"
	three_nodes throughput-1kb --duration "$seconds" --json "$dir/t.json" >/dev/null
	three=$(field "$dir/t.json" "d['produce']['mb_per_sec']")
	half=$(field "$dir/t.json" "int(d['produce']['records_per_sec'] / 2)")
	three_nodes throughput-1kb --duration "$seconds" --rate "$half" --json "$dir/h.json" >/dev/null
	p50=$(field "$dir/h.json" "d['ack_latency']['p50_us']")
	p99=$(field "$dir/h.json" "d['ack_latency']['p99_us']")
	rate=$(field "$dir/h.json" "d['target_rate']")
	echo "round $round: single node $single MB/s; 3 nodes $three MB/s; at $rate records/s (half of that): ack p50 $p50 us, p99 $p99 us"
	echo "$single" >>"$dir/single"; echo "$three" >>"$dir/three"
	echo "$p50" >>"$dir/half_p50"; echo "$p99" >>"$dir/half_p99"
done
s=$(median <"$dir/single"); t=$(median <"$dir/three")
echo "medians ($cluster_kind cluster): single node $s MB/s, 3 nodes $t MB/s, 3 nodes / single $(echo "scale=2; $t / $s" | bc); half rate ack p50 $(median <"$dir/half_p50") us, p99 $(median <"$dir/half_p99") us"
