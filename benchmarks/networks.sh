#!/usr/bin/env bash
# The "Networks" figures of docs/performance.md: one lipcast server (built-in backend) and one probe call per
# row, clean or with the probe's seeded impairment, DURATION_S seconds each, three seeds.
# Usage: bash benchmarks/networks.sh [OUT_DIR]        (ROWS="SPEC|DIR|SEED ..." picks other rows)
set -u
OUT=${1:-out/networks}
DURATION_S=${DURATION_S:-60}
PORT=${PORT:-8391}
BIN=${BIN:-.venv/bin}
DEFAULT_ROWS=""
# The jitter row impairs 10-40 s of the call: its delay during the jitter, and how soon after it is back.
for spec in "clean|up" "loss=2%|up" "loss=5%,burst=4|up" "delay=50ms,jitter=30ms,from=10s,until=40s|up" \
  "loss=2%|down" "rate=300kbps|down"; do
  for seed in 1 2 3; do DEFAULT_ROWS="$DEFAULT_ROWS $spec|$seed"; done
done
ROWS=${ROWS:-$DEFAULT_ROWS}
mkdir -p "$OUT"
"$BIN/lipcast" serve --port "$PORT" --ice-address 127.0.0.1 >"$OUT/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 1 300); do curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break; sleep 0.2; done
for row in $ROWS; do
  spec=${row%%|*}; rest=${row#*|}; dir=${rest%%|*}; seed=${rest#*|}
  name=$(printf '%s' "$spec-$dir-$seed" | tr -c 'a-zA-Z0-9=-' '_')
  impair=()
  [ "$spec" = clean ] || impair=(--impair "$spec" --impair-direction "$dir")
  "$BIN/lipcast" probe "http://127.0.0.1:$PORT" --duration-s "$DURATION_S" --seed "$seed" --ice-address 127.0.0.1 \
    --video-release marker "${impair[@]}" --json "$OUT/$name.json" >"$OUT/$name.txt" 2>&1
  echo "== $spec $dir seed $seed"
  grep -E "server inbound|picture broken|audio in -> audio out|frame latency|fps:|audio returned|mouth follows|impaired|downlink capped" \
    "$OUT/$name.txt"
done
"$BIN/python" benchmarks/networks_table.py "$OUT"
