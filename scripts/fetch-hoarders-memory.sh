#!/usr/bin/env bash
# What consumers that read nothing cost a node and the other consumers: a single node
# (data on the real disk) gets a topic of about 300 MiB (`braid bench --keep`), then
# HOARDERS connections each send FETCHES Fetch requests of 64 MiB (command 31, as
# docs/protocol.md gives it) and never read an answer. Prints the node's resident
# memory (VmRSS from /proc/PID/status) before and 5 s into the attack, and how long
# another connection's 4 MiB fetch takes meanwhile.
#
#   scripts/fetch-hoarders-memory.sh [BRAID_BINARY] [HOARDERS] [FETCHES]
set -euo pipefail
braid=$(realpath "${1:-target/release/braid}")
hoarders=${2:-8}
fetches=${3:-4}
# shellcheck source=lib/one-node.sh
source "$(dirname "$0")/lib/one-node.sh"
start_one_node fetch-hoarders
"$braid" --addr "127.0.0.1:$port" bench throughput-1kb --topics 1 --partitions 1 \
	--records 300000 --keep >/dev/null 2>&1
stream=$("$braid" --addr "127.0.0.1:$port" stream list 2>/dev/null | grep -o 'bench-[0-9-]*' | head -1)
rss() { awk '/VmRSS/ {print $2}' "/proc/$server/status"; }
python3 - "$port" "$stream" "$hoarders" "$fetches" "$server" <<'EOF'
import socket, struct, sys, time
port, stream, hoarders, fetches, pid = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
def rss():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
def string(text):
    raw = text.encode()
    return struct.pack(">H", len(raw)) + raw
def fetch(request_id, offset, max_bytes):
    body = string(stream) + string("t0") + struct.pack(">IQII", 0, offset, max_bytes, 0)
    head = struct.pack(">QH", request_id, 31)
    return struct.pack(">I", len(head) + len(body)) + head + body
print(f"resident before: {rss()} MiB")
held = []
for c in range(hoarders):
    s = socket.create_connection(("127.0.0.1", int(port)))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    for f in range(fetches):
        s.sendall(fetch(f + 1, 0, 64 << 20))
    held.append(s)
time.sleep(5)
print(f"resident 5 s into the attack: {rss()} MiB")
other = socket.create_connection(("127.0.0.1", int(port)))
def read(n):
    data = bytearray()
    while len(data) < n:
        chunk = other.recv(min(n - len(data), 1 << 20))
        if not chunk:
            raise SystemExit("the node closed the other consumer's connection")
        data += chunk
    return bytes(data)
start = time.monotonic()
other.sendall(fetch(1, 0, 4 << 20))
(length,) = struct.unpack(">I", read(4))
reply = read(length)
status = struct.unpack(">H", reply[10:12])[0]
print(f"another consumer's 4 MiB fetch: status {status}, {length} bytes in {time.monotonic() - start:.3f} s")
print(f"resident then: {rss()} MiB")
EOF
