#!/usr/bin/env bash
# Many partitions on one node (issue 24: "one node with 100,000 partitions starting in
# under 10 s"), in topics of 10,000 (the most a topic has), on the real disk under /tmp: how long creating them takes, the bytes
# the node wrote doing it (/proc/PID/io write_bytes), the data directory's size, the
# node's idle CPU and resident memory with them (from /proc), and how long a restart
# takes until /ready answers 200 (every partition open and its group recovered).
#
#   scripts/scale-one-node.sh [BRAID_BINARY] [PARTITIONS]
#   RESTARTS=3 BASELINE=/path/to/older/braid scripts/scale-one-node.sh ...   # alternate
set -euo pipefail
cd "$(dirname "$0")/.."
export RUST_BACKTRACE=0
braid=${1:-target/release/braid}
# Past the default quotas (1,000 partitions a topic, 100,000 in all) on purpose.
export BRAID_TOPIC_PARTITIONS_MAX=10000 BRAID_PARTITIONS_MAX=1000000 BRAID_PARTITIONS_PER_STREAM_MAX=1000000
partitions=${2:-100000}
dir=$(mktemp -d /tmp/braid-scale-one.XXXXXX)
port=18070
http=$((port + 1))
node=

now() { date +%s.%N; }
start() {
	"$braid" server --data-dir "$dir/data" --client-addr 127.0.0.1:$port \
		--http-addr 127.0.0.1:$http --fsync never >"$dir/node.out" 2>&1 &
	node=$!
}
ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http/ready" || true)" = 200 ]; }
written() { awk '/^write_bytes/ {print $2}' "/proc/$node/io"; }
rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$node/status"; }
cpu_ticks() {
	read -r -a stat <"/proc/$node/stat"
	echo $((stat[13] + stat[14]))
}
idle() {
	sleep 10
	local before after hz
	hz=$(getconf CLK_TCK)
	before=$(cpu_ticks)
	sleep 30
	after=$(cpu_ticks)
	echo "$1: idle CPU over 30 s $(echo "scale=2; ($after - $before) * 100 / $hz / 30" | bc)% of one core, $(echo "scale=1; $(rss_kib) / 1024" | bc) MiB resident"
}
trap 'kill -INT $node 2>/dev/null || true; wait $node 2>/dev/null || true; rm -rf "$dir"' EXIT

start
until ready; do sleep 0.1; done
idle "empty node"
empty_rss=$(rss_kib)
"$braid" --addr 127.0.0.1:$port stream create s >/dev/null
w0=$(written)
t0=$(now)
# A topic has at most 10,000 partitions: as many topics as it takes.
left=$partitions
topic=0
while [ "$left" -gt 0 ]; do
	n=$((left < 10000 ? left : 10000))
	"$braid" --addr 127.0.0.1:$port topic create s "t$topic" --partitions "$n" >/dev/null
	left=$((left - n))
	topic=$((topic + 1))
done
until ready; do sleep 0.2; done
t1=$(now)
w1=$(written)
echo "created $partitions partitions in $(echo "$t1 - $t0" | bc) s; the node wrote $(echo "scale=1; ($w1 - $w0) / 1048576" | bc) MiB doing it; data directory $(du -sh "$dir/data" | cut -f1)"
idle "$partitions partitions"
echo "resident memory per partition: $(echo "($(rss_kib) - $empty_rss) * 1024 / $partitions" | bc) bytes (RSS with them minus RSS empty, over the count)"
# Restarts, timed until /ready; with BASELINE=OTHER_BINARY, each restart of this binary
# follows one of the other on the same data (the same disk state for both).
restart() {
	kill -INT $node
	wait $node || true
	sync
	local t0
	t0=$(now)
	start
	until ready; do sleep 0.05; done
	echo "restart of $braid with $partitions partitions on disk: /ready after $(echo "$(now) - $t0" | bc) s"
}
for _ in $(seq "${RESTARTS:-1}"); do
	if [ -n "${BASELINE:-}" ]; then
		ours=$braid
		braid=$BASELINE
		restart
		braid=$ours
	fi
	restart
done
