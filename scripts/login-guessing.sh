#!/usr/bin/env bash
# How fast one source address can guess passwords on a secured node: 16 parallel
# loops of `braid` logins with wrong passwords from 127.0.0.1 for SECONDS seconds,
# then how long the right password takes to get in. Prints the failed logins per
# second and the right login's time.
#
#   scripts/login-guessing.sh [BRAID_BINARY] [SECONDS]
set -euo pipefail
braid=$(realpath "${1:-target/release/braid}")
seconds=${2:-20}
dir=$(mktemp -d)
trap 'kill "$server" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
port=$((20000 + RANDOM % 20000))
printf 'the admin password\n' >"$dir/admin-password"
printf 'a wrong guess\n' >"$dir/guess"
BRAID_AUTHENTICATION=true BRAID_ADMIN_PASSWORD_FILE="$dir/admin-password" BRAID_LOG=error \
	"$braid" server --data-dir "$dir/data" --client-addr "127.0.0.1:$port" \
	--http-addr "127.0.0.1:$((port + 1))" --shards 1 &
server=$!
for _ in $(seq 100); do
	"$braid" --addr "127.0.0.1:$port" --user admin --password-file "$dir/admin-password" \
		stream list >/dev/null 2>&1 && break
	sleep 0.1
done
end=$((SECONDS + seconds))
for worker in $(seq 16); do
	(
		n=0
		while [ $SECONDS -lt $end ]; do
			"$braid" --addr "127.0.0.1:$port" --user admin --password-file "$dir/guess" \
				stream list >/dev/null 2>&1 || n=$((n + 1))
		done
		echo "$n" >"$dir/worker-$worker"
	) &
done
wait $(jobs -p | grep -v "^$server\$") 2>/dev/null || true
sleep 1
failed=$(cat "$dir"/worker-* | paste -sd+ | bc)
echo "failed logins from one address in ${seconds}s: $failed ($(echo "scale=1; $failed / $seconds" | bc) a second)"
start=$(date +%s.%N)
"$braid" --addr "127.0.0.1:$port" --user admin --password-file "$dir/admin-password" stream list >/dev/null
echo "the right password then got in after $(echo "$(date +%s.%N) - $start" | bc) s"
