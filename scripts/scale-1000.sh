#!/usr/bin/env bash
# 1,000 (or PARTITIONS) partitions on a 3-node cluster on this machine (`braid cluster
# local 3`): how long creating them takes until every member has every group caught
# up, the bytes each node wrote meanwhile (/proc/PID/io write_bytes), the idle CPU and
# resident memory of each node (from /proc) and per partition, and the start-up time
# of the cluster with them on disk (from the start until every member answers /ready).
#
#   scripts/scale-1000.sh [BRAID_BINARY] [PARTITIONS]
set -euo pipefail
cd "$(dirname "$0")/.."
braid=${1:-target/release/braid}
# Past the default quotas (1,000 partitions a topic, 100,000 in all) on purpose.
export BRAID_TOPIC_PARTITIONS_MAX=10000 BRAID_PARTITIONS_MAX=1000000 BRAID_PARTITIONS_PER_STREAM_MAX=1000000
partitions=${2:-1000}
dir=$(mktemp -d /tmp/braid-scale.XXXXXX)
base=17070
pids=()

now() { date +%s.%N; }
health() { curl -s "http://127.0.0.1:$1/health" || true; }
ready_all() {
	for i in 0 1 2; do
		[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((base + 10 + i))/ready" || true)" = 200 ] || return 1
	done
}
groups_all() {
	for i in 0 1 2; do
		health $((base + 10 + i)) | grep -q "\"caught_up\":true,\"groups\":$1," || return 1
	done
}
start() {
	"$braid" cluster local 3 --base-port $base --data-dir "$dir" --fsync never >"$dir/cluster.out" 2>&1 &
	cluster=$!
}
stop() {
	kill -INT "$cluster"
	wait "$cluster" || true
}
servers() { pgrep -P "$cluster" | tr '\n' ' '; }
written() { for pid in $(servers); do awk '/^write_bytes/ {printf "%s ", $2}' "/proc/$pid/io"; done; }
rss_kib() { for pid in $(servers); do awk '/VmRSS/ {printf "%s ", $2}' "/proc/$pid/status"; done; }
cpu_ticks() {
	local total=0
	for pid in $1; do
		read -r -a stat <"/proc/$pid/stat"
		total=$((total + stat[13] + stat[14]))
	done
	echo "$total"
}
report_idle() {
	local who=$1
	sleep 10
	local p
	p=$(servers)
	local before after hz=$(getconf CLK_TCK)
	before=$(cpu_ticks "$p")
	sleep 30
	after=$(cpu_ticks "$p")
	echo "$who: idle CPU of the 3 nodes together over 30 s: $(echo "scale=2; ($after - $before) * 100 / $hz / 30" | bc)% of one core"
	for pid in $p; do
		echo "  pid $pid: $(grep VmRSS "/proc/$pid/status" | awk '{print $2/1024 " MiB resident"}')"
	done
}
trap 'kill -INT $cluster 2>/dev/null || true; wait $cluster 2>/dev/null || true; rm -rf "$dir"' EXIT

start
until ready_all; do sleep 0.2; done
report_idle "empty cluster"
"$braid" --addr 127.0.0.1:$base stream create s >/dev/null 2>&1
empty_rss=($(rss_kib))
w0=($(written))
t0=$(now)
"$braid" --addr 127.0.0.1:$base topic create s t --partitions "$partitions" >/dev/null 2>&1
until groups_all $((partitions + 1)); do sleep 0.2; done
echo "created $partitions partitions: every member caught up on every group after $(echo "$(now) - $t0" | bc) s"
w1=($(written))
for i in 0 1 2; do
	echo "  node $i wrote $(echo "scale=1; (${w1[$i]} - ${w0[$i]}) / 1048576" | bc) MiB meanwhile"
done
report_idle "$partitions partitions"
rss=($(rss_kib))
for i in 0 1 2; do
	echo "  node $i: $(echo "(${rss[$i]} - ${empty_rss[$i]}) * 1024 / $partitions" | bc) bytes resident per replicated partition (RSS with them minus RSS empty, over the count)"
done
stop
t0=$(now)
start
until ready_all && groups_all $((partitions + 1)); do sleep 0.2; done
echo "restart with $partitions partitions on disk: every member ready after $(echo "$(now) - $t0" | bc) s"
report_idle "$partitions partitions after a restart"
