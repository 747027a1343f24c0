#!/usr/bin/env bash
# Issue 12's figures on the GPU device in one run (random Wav2Lip weights: no checkpoint here):
#   1. the engine's whole render at batch 1 and 128: eager fp32 of the whole face (the reference), the fp16
#      graphs of last round (whole face) and now (rows only), compiled kernels (benchmarks/engine_profile.py);
#   2. the first build of the compiled kernels, every default bucket, from an empty cache (`engine build`);
#   3. three cold starts of the server with that (warm) cache, to /readyz, with the server's defaults;
#   4. one Wav2Lip session on the last of them (`lipcast probe`, marker release and aiortc's receiver);
#   5. the GPU tests.
# Results (JSON, logs) in $OUT.   Usage: bash benchmarks/w2l_acceptance.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/w2l-acceptance}
mkdir -p "$OUT"
PY=${PY:-python3}
PORT=${PORT:-8091}
DURATION_S=${DURATION_S:-20}
CACHE=${CACHE:-/tmp/lipcast-compile-$$}
rm -rf "$CACHE"
START=$(date +%s)
step() { echo "=== $* ($(date +%T), +$(($(date +%s) - START)) s)"; }
seconds_since() { $PY -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$1"; }

step environment
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"

step "engine profile: batch 1 and 128"
timeout 300 $PY benchmarks/engine_profile.py --sizes 1,128 --iters 50 --modes default --out "$OUT" 2>&1 \
  | grep -E "^\[|Error|failed" | cut -c1-400

step "first build of the compiled kernels, every default bucket, empty cache"
t0=$(date +%s.%N)
timeout 300 $PY -m server engine build --device cuda --compile-cache-dir "$CACHE" --json "$OUT/build.json" \
  2>&1 | grep -v "^$" | tail -12
echo "first build: $(seconds_since "$t0") s (the process, start to exit)" | tee "$OUT/build_time.txt"

$PY -c "import torch; from pipeline.wav2lip.model import Wav2Lip; torch.save({'state_dict': Wav2Lip().state_dict()}, '/tmp/w2l.pth')"
for start in 1 2 3; do
  step "cold start $start with the warm cache (server defaults, wav2lip on cuda)"
  t0=$(date +%s.%N)
  $PY -m server serve --backend wav2lip --checkpoint /tmp/w2l.pth --device cuda --port "$PORT" \
    --ice-address 127.0.0.1 --compile-cache-dir "$CACHE" > "$OUT/serve_$start.log" 2>&1 &
  server=$!
  for _ in $(seq 1 1200); do
    curl -sf "http://127.0.0.1:$PORT/readyz" > /dev/null 2>&1 && break
    kill -0 $server 2> /dev/null || break
    sleep 0.1
  done
  echo "start $start: ready after $(seconds_since "$t0") s" | tee -a "$OUT/ready.txt"
  grep -E "compile cache|compiled kernels ready|render budget|warm-up|fp16|Error|Traceback" "$OUT/serve_$start.log" \
    | cut -c1-220 | tail -4
  if [ "$start" = 3 ]; then
    for release in marker aiortc; do
      step "one session, video release $release"
      timeout $((DURATION_S + 40)) $PY -m server probe "http://127.0.0.1:$PORT" --ice-address 127.0.0.1 \
        --duration-s "$DURATION_S" --video-release "$release" --json "$OUT/probe_$release.json" 2>&1 \
        | grep -v " INFO " | head -26
    done
  fi
  kill $server
  wait $server 2> /dev/null
done

step "GPU tests"
LIPCAST_COMPILE_CACHE_DIR="$CACHE" timeout 150 $PY -m pytest -q -m gpu tests/pipeline -p no:cacheprovider 2>&1 | tail -2
step done
