# Sourced by the single-node measurement scripts: `start_one_node NAME` starts
# "$braid" as one node on a random loopback port, its data in a fresh directory under
# BENCH_DIR (default: the current directory, on the real disk), and waits until it
# answers. It sets `dir`, `port` (clients; HTTP on port + 1) and `server`, and stops
# the node and removes the directory when the script exits.
start_one_node() {
	dir=$(mktemp -d -p "${BENCH_DIR:-$PWD}" "$1.XXXXXX")
	trap 'kill "$server" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
	port=$((20000 + RANDOM % 20000))
	BRAID_LOG=warn "$braid" server --data-dir "$dir/data" --client-addr "127.0.0.1:$port" \
		--http-addr "127.0.0.1:$((port + 1))" >"$dir/server.out" 2>&1 &
	server=$!
	for _ in $(seq 100); do
		"$braid" --addr "127.0.0.1:$port" stream list >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "the node did not answer; its output:" >&2
	cat "$dir/server.out" >&2
	return 1
}
