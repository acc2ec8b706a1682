#!/usr/bin/env bash
# What consumer-group members can cost a node: a single node, one topic, and one client
# that joins MEMBERS members with NAME_BYTES-byte names to one group (JoinGroup,
# command 40, as docs/protocol.md gives it; 300 s session timeout, no heartbeats
# needed within the run), then asks DescribeGroup. Prints the joins taken and refused
# (by status), the node's resident memory before and after (VmRSS from
# /proc/PID/status), and the DescribeGroup answer's size or error.
#
#   scripts/group-members-memory.sh [BRAID_BINARY] [MEMBERS] [NAME_BYTES]
set -euo pipefail
braid=$(realpath "${1:-target/release/braid}")
members=${2:-8000}
name_bytes=${3:-60000}
# shellcheck source=lib/one-node.sh
source "$(dirname "$0")/lib/one-node.sh"
start_one_node group-members
"$braid" --addr "127.0.0.1:$port" stream create s >/dev/null 2>&1
"$braid" --addr "127.0.0.1:$port" topic create s t --partitions 4 >/dev/null 2>&1
rss() { awk '/VmRSS/ {print $2 " kB"}' "/proc/$server/status"; }
echo "resident before: $(rss)"
python3 - "$port" "$members" "$name_bytes" <<'EOF'
import collections, socket, struct, sys
port, members, name_bytes = (int(a) for a in sys.argv[1:4])
s = socket.create_connection(("127.0.0.1", port))
def read(n):
    data = bytearray()
    while len(data) < n:
        chunk = s.recv(min(n - len(data), 1 << 20))
        if not chunk:
            raise SystemExit("the node closed the connection")
        data += chunk
    return bytes(data)
def string(text):
    raw = text.encode()
    return struct.pack(">H", len(raw)) + raw
def call(request_id, command, body):
    head = struct.pack(">QH", request_id, command)
    s.sendall(struct.pack(">I", len(head) + len(body)) + head + body)
    (length,) = struct.unpack(">I", read(4))
    reply = read(length)
    return struct.unpack(">H", reply[10:12])[0], length
statuses = collections.Counter()
for i in range(members):
    name = (f"member-{i}-" * (name_bytes // 8 + 1))[: min(name_bytes, 65535)]
    body = string("s") + string("g") + string("t") + string(name) + struct.pack(">I", 300_000)
    statuses[call(i + 1, 40, body)[0]] += 1
print("joins by status (0 taken):", dict(statuses))
status, length = call(members + 1, 46, string("s") + string("g"))
print(f"DescribeGroup: status {status}, answer {length} bytes")
EOF
echo "resident after: $(rss)"
