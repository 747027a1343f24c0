#!/usr/bin/env bash
# Issue 28's box acceptance: one call per configuration on a fresh server (one media worker, the built-in
# backend): 320x320 VP8 (the default), 1280x720 H.264 and VP8 (astronaut-720p). The probe's summary (fps,
# frame gaps, server CPU per frame) and the server's per-stage times (encode, compose) per configuration in
# $OUT/NAME.probe.txt and $OUT/NAME.metrics.txt.
#   bash benchmarks/hd_box_call.sh
set -u
OUT=${OUT:-/tmp/hd_box_call}
BIN=${BIN:-.venv/bin}
PORT=${PORT:-8728}
DURATION_S=${DURATION_S:-20}
mkdir -p "$OUT"
run() {  # name avatar size codec
  "$BIN/lipcast" serve --port "$PORT" --media-workers 1 --ice-address 127.0.0.1 --builtin-hd-sizes 1280x720 \
    > "$OUT/$1.server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 60); do curl -sf "http://127.0.0.1:$PORT/readyz" > /dev/null && break; sleep 1; done
  local args=(--ice-address 127.0.0.1 --duration-s "$DURATION_S" --json "$OUT/$1.json" --codec "$4")
  [ -n "$2" ] && args+=(--avatar "$2")
  [ -n "$3" ] && args+=(--size "$3")
  "$BIN/lipcast" probe "http://127.0.0.1:$PORT" "${args[@]}" > "$OUT/$1.probe.txt" 2>&1
  curl -s "http://127.0.0.1:$PORT/metrics" \
    | grep -E 'stage_seconds_(sum|count)\{stage="(encode_video|encode_audio|compose|render)' > "$OUT/$1.metrics.txt"
  kill "$pid"; wait "$pid"
  echo "== $1"; grep -E "fps|frame gap|server CPU" "$OUT/$1.probe.txt"
}
run p320-vp8 "" "" vp8
run p720-h264 astronaut-720p 1280x720 h264
run p720-vp8 astronaut-720p 1280x720 vp8
