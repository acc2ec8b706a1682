#!/usr/bin/env bash
# Seed 001's experiment at its own scale: a 3-node cluster of separate processes on
# this machine (`braid cluster local 3`, each member with its own limit of open
# files), 30,000 (or PARTITIONS) partitions, 32 sessions that write to every one and
# then end, once after a create pass and once after a write pass; prints and saves
# `braid bench retirement`'s table (time from the last end to the FinalizeSession that
# retires them all, the FinalizeSession ops, each member's peak of unproven copies,
# the debt) as JSON.
#
#   scripts/retirement-30k.sh [BRAID_BINARY] [PARTITIONS] [JSON_OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
braid=${1:-target/release/braid}
partitions=${2:-30000}
out=${3:-retirement-$partitions.json}
dir=$(mktemp -d /var/tmp/braid-retire.XXXXXX)
base=17170
"$braid" cluster local 3 --base-port $base --data-dir "$dir" --fsync always >"$dir/cluster.out" 2>&1 &
cluster=$!
# The members' logs are kept beside the figures.
trap 'kill -INT $cluster 2>/dev/null; wait $cluster 2>/dev/null; cp "$dir"/node-*.log "$(dirname "$out")"/ 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 600); do
	ready=0
	for i in 0 1 2; do
		[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((base + 10 + i))/ready" || true)" = 200 ] && ready=$((ready + 1))
	done
	[ $ready = 3 ] && break
	sleep 0.2
done
addrs=127.0.0.1:$base,127.0.0.1:$((base + 1)),127.0.0.1:$((base + 2))
https=127.0.0.1:$((base + 10)),127.0.0.1:$((base + 11)),127.0.0.1:$((base + 12))
"$braid" --addr "$addrs" bench retirement --http-addrs "$https" --partitions "$partitions" --json "$out"
echo "figures in $out"
