#!/usr/bin/env bash
# Issue 12's figures on the GPU device in one run (random Wav2Lip weights: no checkpoint here):
#   1. the engine's whole render at batch 1 and 128: eager fp32 of the whole face (the reference), the fp16
#      graphs of last round (whole face) and now (rows only), compiled kernels (benchmarks/engine_profile.py);
#   2. the first build of the compiled kernels, every default bucket, from an empty cache (`engine build`);
#   3. cold starts of the server with that (warm) cache, to /readyz: with one media worker, and with the
#      server's defaults (a media worker per core but one);
#   4. one Wav2Lip session on each (`lipcast probe`, marker release);
#   5. the GPU tests.
# Results in $OUT (at most a few files: the device returns few; logs and kernel tables in logs.tgz).
#   bash benchmarks/w2l_acceptance.sh    (PROFILE=0 skips step 1, TESTS=0 step 5; DEVICE=cpu: a dry run)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/w2l-acceptance}
WORK=$(mktemp -d)
mkdir -p "$OUT" "$WORK/profile"
PY=${PY:-python3}
PORT=${PORT:-8091}
DEVICE=${DEVICE:-cuda}
DURATION_S=${DURATION_S:-20}
CACHE=${CACHE:-$WORK/compile-cache}
START=$(date +%s)
step() { echo "=== $* ($(date +%T), +$(($(date +%s) - START)) s)"; }
seconds_since() { $PY -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$1"; }

step environment
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

if [ "${PROFILE:-1}" = 1 ]; then
  step "engine profile: batch 1 and 128"
  timeout 300 $PY benchmarks/engine_profile.py --sizes 1,128 --iters 50 --modes default --out "$WORK/profile" \
    2>&1 | grep -E "^\[|Error|failed" | cut -c1-400
  cp "$WORK/profile/engine_profile.json" "$OUT/"
fi

step "first build of the compiled kernels, every default bucket, empty cache"
t0=$(date +%s.%N)
timeout 300 $PY -m server engine build --device "$DEVICE" --compile-cache-dir "$CACHE" --json "$OUT/build.json" \
  2>&1 | grep -v "^$" | tail -12
echo "first build: $(seconds_since "$t0") s (the process, start to exit)" | tee "$OUT/build_time.txt"

$PY -c "import torch; from pipeline.wav2lip.model import Wav2Lip; torch.save({'state_dict': Wav2Lip().state_dict()}, '/tmp/w2l.pth')"
serve_probe() {  # $1 tag; the rest: extra serve flags. A cold start with the warm cache, then one session.
  local tag=$1 t0 server
  shift
  step "cold start '$tag' with the warm cache (wav2lip on cuda; flags: $*)"
  t0=$(date +%s.%N)
  $PY -m server serve --backend wav2lip --checkpoint /tmp/w2l.pth --device "$DEVICE" --port "$PORT" \
    --ice-address 127.0.0.1 --compile-cache-dir "$CACHE" "$@" > "$WORK/serve_$tag.log" 2>&1 &
  server=$!
  until curl -sf "http://127.0.0.1:$PORT/readyz" > /dev/null 2>&1; do
    kill -0 $server 2> /dev/null || break
    [ "$($PY -c "import time; print(int(time.time() - $t0))")" -gt "${READY_LIMIT_S:-240}" ] && break
    sleep 0.1
  done
  echo "$tag: ready after $(seconds_since "$t0") s" | tee -a "$OUT/ready.txt"
  grep -E "compile cache|compiled kernels ready|media worker|render budget|warm-up|fp16|Error|Traceback" \
    "$WORK/serve_$tag.log" | cut -c1-200 | tail -6
  step "one session on '$tag'"
  timeout $((DURATION_S + 40)) $PY -m server probe "http://127.0.0.1:$PORT" --ice-address 127.0.0.1 \
    --duration-s "$DURATION_S" --video-release marker --json "$OUT/probe_$tag.json" 2>&1 \
    | grep -v " INFO " | head -24
  kill $server
  wait $server 2> /dev/null
  tar -czf "$OUT/logs.tgz" --exclude=compile-cache -C "$WORK" .
}
serve_probe one_worker --media-workers 1
serve_probe defaults

if [ "${TESTS:-1}" = 1 ]; then
  step "GPU tests"
  LIPCAST_COMPILE_CACHE_DIR="$CACHE" timeout 150 $PY -m pytest -q -m gpu tests/pipeline -p no:cacheprovider \
    2>&1 | tail -2
fi
tar -czf "$OUT/logs.tgz" --exclude=compile-cache -C "$WORK" .
step done
