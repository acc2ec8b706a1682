#!/usr/bin/env bash
# What many small admin requests cost the data path: a single node (data on the real
# disk) runs `braid bench end-to-end-1kb` at a fixed RATE (records/s, produced and
# consumed at once) for SECONDS seconds, and from 10 s in one connection creates
# STREAMS streams, one request after another. Prints how long the creates took (per
# thousand, so a cost that grows with the metadata shows), the run's produce ack and
# end-to-end (produce to fetch) percentiles, and the fewest records produced in any
# second. SECONDS must cover the creates: the script says so if they outlast the run.
#
#   scripts/metadata-under-load.sh [BRAID_BINARY] [STREAMS] [SECONDS] [RATE]
set -euo pipefail
braid=$(realpath "${1:-target/release/braid}")
streams=${2:-20000}
seconds=${3:-150}
rate=${4:-20000}
export BRAID_STREAMS_MAX=$((streams + 10))
# shellcheck source=lib/one-node.sh
source "$(dirname "$0")/lib/one-node.sh"
start_one_node metadata-under-load
"$braid" --addr "127.0.0.1:$port" bench end-to-end-1kb --rate "$rate" --warmup 2 \
	--duration "$seconds" --json "$dir/report.json" >"$dir/bench.out" 2>&1 &
bench=$!
sleep 10
# CreateStream (command 10) frames, one at a time, on one connection (docs/protocol.md).
python3 - "$port" "$streams" >"$dir/creates.out" <<'EOF'
import socket, struct, sys, time
port, count = int(sys.argv[1]), int(sys.argv[2])
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def read(n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise SystemExit("the node closed the connection")
        data += chunk
    return data
start = last = time.monotonic()
for i in range(1, count + 1):
    name = f"tenant-{i:06d}".encode()
    body = struct.pack(">QH", i, 10) + struct.pack(">H", len(name)) + name
    s.sendall(struct.pack(">I", len(body)) + body)
    (length,) = struct.unpack(">I", read(4))
    reply = read(length)
    status = struct.unpack(">H", reply[10:12])[0]
    if status != 0:
        raise SystemExit(f"create {i}: status {status}: {reply[12:]!r}")
    if i % 1000 == 0:
        now = time.monotonic()
        print(f"{i}: {now - last:.2f} s for the last 1000")
        last = now
print(f"{count} streams created in {time.monotonic() - start:.1f} s")
EOF
wait "$bench" || { cat "$dir/bench.out"; exit 1; }
cat "$dir/creates.out"
python3 - "$dir/report.json" "$seconds" <<'EOF'
import json, statistics, sys
report = json.load(open(sys.argv[1]))
ack, e2e = report["ack_latency"], report["end_to_end_latency"]
seconds = [s["produced"] for s in report["timeline"]]
print(f"produce ack p50 {ack['p50_us']} us, p99 {ack['p99_us']} us, max {ack['max_us']} us")
print(f"end to end p50 {e2e['p50_us']} us, p99 {e2e['p99_us']} us, max {e2e['max_us']} us")
print(f"records per second: fewest {min(seconds)}, median {statistics.median(seconds)}")
EOF
grep -q "streams created" "$dir/creates.out" || echo "the creates outlasted the run: raise SECONDS"
