#!/usr/bin/env bash
# What client sessions cost: throughput-1kb (batches of 100) with and without
# `--sessions`, alternated, ROUNDS rounds, on one embedded node and on an embedded
# 3-member cluster; one line per run, and the JSON reports in OUT.
#
#   scripts/sessions-bench.sh [BRAID_BINARY]      ROUNDS=5 OUT=/tmp/sessions-bench
set -euo pipefail
bin="${1:-target/release/braid}"
rounds="${ROUNDS:-5}"
out="${OUT:-/tmp/sessions-bench}"
mkdir -p "$out"
for round in $(seq 1 "$rounds"); do
  # Alternate which goes first, so a warming machine favours neither.
  order="plain sessions"
  (( round % 2 == 0 )) && order="sessions plain"
  for members in 1 3; do
    for mode in $order; do
      flag=()
      [[ $mode == sessions ]] && flag=(--sessions)
      json="$out/r$round-m$members-$mode.json"
      "$bin" --json "$json" bench --embedded --members "$members" throughput-1kb \
        --batch 100 --duration 10 --warmup 2 "${flag[@]}" > /dev/null 2>&1
      python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], round(r["produce"]["records_per_sec"]))' \
        "$json" "round $round, $members member(s), $mode:"
    done
  done
done
