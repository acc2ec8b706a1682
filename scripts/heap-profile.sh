#!/usr/bin/env bash
# Where the memory of idle partitions goes: a 3-node cluster on loopback (three
# `braid server`s, as `braid cluster local 3` starts them) with member 0 under
# heaptrack, PARTITIONS partitions created and caught up on every member, then member 0
# killed (-9) while idle, so that what heaptrack reports as leaked is what the member
# held idle. Prints the heap held per partition and the largest holders by the
# deepest braid function on their allocation's stack. Use a debug build (its stacks
# name every function; allocation sizes are the same as a release build's).
#
#   scripts/heap-profile.sh [BRAID_BINARY] [PARTITIONS]    # about a minute for 10,000
#
# With RESTART=1, member 0 first runs plain, is stopped (SIGINT) once every member has
# caught up, and restarts under heaptrack: the profile is then of a member that opened
# its partitions from disk.
#
# Needs heaptrack (and heaptrack_print) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
braid=$(realpath "${1:-target/debug/braid}")
# Past the default quotas (1,000 partitions a topic, 100,000 in all) on purpose.
export BRAID_TOPIC_PARTITIONS_MAX=10000 BRAID_PARTITIONS_MAX=1000000 BRAID_PARTITIONS_PER_STREAM_MAX=1000000
partitions=${2:-10000}
base=19370
root=$(mktemp -d /tmp/braid-heap.XXXXXX)
trap 'pkill -INT -f "server --data-dir $root/node-" 2>/dev/null || true; sleep 1; rm -rf "$root"' EXIT

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$root/secret"
chmod 600 "$root/secret"
members=()
for id in 0 1 2; do
	members+=(--member "$id=127.0.0.1:$((base + 20 + id))/127.0.0.1:$((base + id))")
done
for id in 0 1 2; do
	args=(server --data-dir "$root/node-$id" --client-addr "127.0.0.1:$((base + id))"
		--http-addr "127.0.0.1:$((base + 10 + id))" --cluster-id local --node-id "$id"
		--cluster-secret-file "$root/secret" "${members[@]}" --fsync never --init)
	if [ "$id" = 0 ] && [ "${RESTART:-0}" != 1 ]; then
		heaptrack -o "$root/member-0" "$braid" "${args[@]}" >"$root/node-$id.out" 2>&1 &
	else
		"$braid" "${args[@]}" >"$root/node-$id.out" 2>&1 &
	fi
done
all() {
	for id in 0 1 2; do "$@" "$id" || return 1; done
}
ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((base + 10 + $1))/ready" || true)" = 200 ]; }
caught_up() { curl -s "http://127.0.0.1:$((base + 10 + $1))/health" | grep -q "\"caught_up\":true,\"groups\":$((partitions + 1)),"; }
until all ready; do sleep 0.5; done
"$braid" --addr "127.0.0.1:$base" stream create s >/dev/null
"$braid" --addr "127.0.0.1:$base" topic create s t --partitions "$partitions" >/dev/null
until all caught_up; do sleep 1; done
if [ "${RESTART:-0}" = 1 ]; then
	pkill -INT -f "$braid server --data-dir $root/node-0"
	while pgrep -f "$braid server --data-dir $root/node-0" >/dev/null; do sleep 0.2; done
	args=(server --data-dir "$root/node-0" --client-addr "127.0.0.1:$base"
		--http-addr "127.0.0.1:$((base + 10))" --cluster-id local --node-id 0
		--cluster-secret-file "$root/secret" "${members[@]}" --fsync never)
	heaptrack -o "$root/member-0" "$braid" "${args[@]}" >>"$root/node-0.out" 2>&1 &
	until all ready && all caught_up; do sleep 1; done
fi
sleep 30
pid=$(pgrep -f "$braid server --data-dir $root/node-0" | tail -1) # the last: heaptrack started it
echo "member 0 idle with $partitions partitions: $(awk '/VmRSS/ {print $2, $3}' "/proc/$pid/status") resident"
kill -9 "$pid"
while pgrep -f "heaptrack_interpret" >/dev/null; do sleep 1; done
heaptrack_print -f "$root/member-0.zst" --print-leaks 0 --print-peaks 0 --print-allocators 0 \
	--print-temporary 0 -F "$root/held.stacks" --flamegraph-cost-type leaked >/dev/null 2>&1
python3 - "$root/held.stacks" "$partitions" <<'PY'
import collections, re, sys
held, by = 0, collections.Counter()
for line in open(sys.argv[1]):
    stack, _, cost = line.rstrip("\n").rpartition(" ")
    cost = int(cost)
    held += cost
    ours = [f for f in stack.split(";") if re.search(r"braid_(node|storage|vsr|proto|bus)", f)]
    by[re.sub(r"::h[0-9a-f]{16}", "", ours[-1])[:110] if ours else "(outside braid)"] += cost
n = int(sys.argv[2])
print(f"heap held: {held} bytes, {held / n:.0f} per partition")
for where, cost in by.most_common(20):
    print(f"{cost / n:8.0f} B/partition  {where}")
PY
