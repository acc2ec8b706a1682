#!/usr/bin/env bash
# What TLS and authentication cost on `throughput-1kb`: a `braid server` (release build)
# is started plain, with authentication, with TLS, and with both, one at a time, and
# `braid bench throughput-1kb` runs against each; ROUNDS rounds (default 3) interleave
# the four so drift on a shared machine hits all alike. Prints each run's MB/s and the
# medians, with each configuration as a ratio of plain in the same run.
#
#   scripts/security-cost.sh [ROUNDS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-3}"
SECONDS_PER_RUN="${2:-10}"
cargo build --release -q -p braid-cli
BRAID="$PWD/target/release/braid"
WORK="$(mktemp -d)"
trap 'kill "${SERVER:-}" 2>/dev/null || true; rm -rf "$WORK"' EXIT

# A CA and a certificate for localhost it signed.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj /CN=braid-bench-ca -keyout "$WORK/ca-key.pem" -out "$WORK/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=localhost \
  -keyout "$WORK/node-key.pem" -out "$WORK/node.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost\n' > "$WORK/ext"
openssl x509 -req -in "$WORK/node.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca-key.pem" \
  -CAcreateserial -days 2 -extfile "$WORK/ext" -out "$WORK/node.pem" 2>/dev/null
printf 'bench-admin-password\n' > "$WORK/password"

run() { # run NAME: start a server configured as NAME, bench it, print MB/s
  local name="$1" data="$WORK/data-$1"
  rm -rf "$data"
  local env=(BRAID_LOG=warn BRAID_DATA_DIR="$data" BRAID_CLIENT_ADDR=127.0.0.1:0 BRAID_HTTP_ADDR=127.0.0.1:0)
  local client=()
  case "$name" in
    auth|tls+auth) env+=(BRAID_AUTHENTICATION=true BRAID_ADMIN_PASSWORD_FILE="$WORK/password")
                   client+=(--user admin --password-file "$WORK/password") ;;
  esac
  case "$name" in
    tls|tls+auth) env+=(BRAID_TLS_CERT_FILE="$WORK/node.pem" BRAID_TLS_KEY_FILE="$WORK/node-key.pem")
                  client+=(--tls-ca "$WORK/ca.pem" --tls-server-name localhost) ;;
  esac
  env "${env[@]}" "$BRAID" server > "$WORK/listening" &
  SERVER=$!
  for _ in $(seq 100); do [ -s "$WORK/listening" ] && break; sleep 0.1; done
  local addr
  addr="$(awk '{print $4}' "$WORK/listening")"
  env -u BRAID_ADDR "$BRAID" --addr "$addr" "${client[@]}" \
    bench throughput-1kb --duration "$SECONDS_PER_RUN" --json "$WORK/report.json" > /dev/null
  kill "$SERVER"; wait "$SERVER" || true; SERVER=
  rm -f "$WORK/listening"
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["produce"]["mb_per_sec"])' "$WORK/report.json"
}

declare -A RESULTS
for round in $(seq "$ROUNDS"); do
  for name in plain auth tls tls+auth; do
    mbs="$(run "$name")"
    RESULTS[$name]="${RESULTS[$name]:-} $mbs"
    echo "round $round $name: $mbs MB/s"
  done
done
python3 - "${RESULTS[plain]}" "${RESULTS[auth]}" "${RESULTS[tls]}" "${RESULTS[tls+auth]}" <<'PY'
import statistics, sys
names = ["plain", "auth", "tls", "tls+auth"]
runs = [[float(x) for x in arg.split()] for arg in sys.argv[1:]]
plain = statistics.median(runs[0])
for name, values in zip(names, runs):
    m = statistics.median(values)
    print(f"{name:9} median {m:8.1f} MB/s  ({m / plain:.2f} x plain)  runs {values}")
PY
