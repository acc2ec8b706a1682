#!/usr/bin/env bash
# Network faults between three real `braid server` processes, each in its own network
# namespace (needs root and iproute2; about 2 minutes on 2 cores): the primary cut off
# from its peers while clients still reach it, one-way cuts either way, and a
# half-open link (link down: no FIN, no RST). Each checks that a client of the old
# primary alone gets nothing acknowledged during the cut, that every acknowledged
# record is read back at its offset after the heal, and that each group's commit point
# (op and checksum) is the same on every member.
#
#   sudo scripts/network-faults.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test -p braid-cli --release --test network_faults -- --ignored --nocapture --test-threads 1
