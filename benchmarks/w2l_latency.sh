#!/usr/bin/env bash
# Issue 12: one Wav2Lip session's latency on the GPU (random weights), with the server's defaults (adaptive
# jitter buffer, render budget from the engine's warm-up), measured by `lipcast probe`: both alignments,
# the probe's aiortc receiver and the marker release. Results (probe JSON, summaries) in $OUT.
#   bash benchmarks/w2l_latency.sh            # on the GPU device
#   DEVICE=cpu DURATION_S=5 bash benchmarks/w2l_latency.sh   # a dry run here
set -u
OUT=${OUT:-/tmp/w2l-latency}
mkdir -p "$OUT"
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
DURATION_S=${DURATION_S:-20}
PORT=${PORT:-8091}
$PY -c "import torch; from pipeline.wav2lip.model import Wav2Lip; torch.save({'state_dict': Wav2Lip().state_dict()}, '/tmp/w2l.pth')"
serve_probe() {  # $1 tag, $2 video-release modes (comma-separated), rest: extra serve flags
  local tag=$1 releases=$2; shift 2
  local t0 t1
  t0=$(date +%s.%N)
  $PY -m lipcast serve --backend wav2lip --checkpoint /tmp/w2l.pth --device "$DEVICE" --port "$PORT" \
    --ice-address 127.0.0.1 --media-workers 1 --batch-sizes 1,2,4 --wav2lip-compile off "$@" \
    > "$OUT/serve_$tag.log" 2>&1 &
  local server=$!
  for _ in $(seq 1 1200); do
    curl -sf "http://127.0.0.1:$PORT/readyz" > /dev/null 2>&1 && break
    kill -0 $server 2> /dev/null || break
    sleep 0.1
  done
  t1=$(date +%s.%N)
  $PY -c "print(f'$tag: ready after {$t1 - $t0:.1f} s')"
  grep -E "render budget|fp16|Error" "$OUT/serve_$tag.log" | cut -c1-200 | tail -3
  for release in ${releases//,/ }; do
    echo "--- probe $tag, video release $release"
    timeout $((DURATION_S + 40)) $PY -m lipcast probe "http://127.0.0.1:$PORT" --ice-address 127.0.0.1 \
      --duration-s "$DURATION_S" --video-release "$release" --json "$OUT/probe_${tag}_$release.json" 2>&1 \
      | grep -v " INFO " | head -24
  done
  kill $server; wait $server 2> /dev/null
}
serve_probe inference marker,aiortc
serve_probe training marker --wav2lip-alignment training
