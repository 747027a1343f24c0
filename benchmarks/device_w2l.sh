#!/usr/bin/env bash
# Issue 12 on the device (H200), one run: compiled kernels (first build, per mode), model bench (eager fp32
# vs eager fp16 graphs vs compiled) at batch 1 and 128, cold start to ready with a warm compile cache, one
# Wav2Lip session measured with `lipcast probe` (audio->mouth, A/V offset, per-stage breakdown), GPU tests.
# Results in $OUT. Usage: bash benchmarks/device_w2l.sh [tiny]   (tiny: CPU, small settings, for a dry run)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/w2l-out}
mkdir -p "$OUT"
DEVICE=cuda; SIZES=1,128; ITERS=50; SERVE_SIZES=1,2,4; BUDGET_S=${BUDGET_S:-540}
if [ "${1:-}" = tiny ]; then DEVICE=cpu; SIZES=1; ITERS=2; SERVE_SIZES=1,2; fi
PY=${PY:-python3}
CACHE=${CACHE:-/tmp/lipcast-compile-$$}
rm -rf "$CACHE"
START=$(date +%s)
step() { echo "=== $* ($(date +%T), +$(( $(date +%s) - START )) s)"; }
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
step environment
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null | tee "$OUT/gpu.txt"
$PY -c "import torch; print(torch.__version__, torch.version.cuda)"
$PY -c "import triton; print('triton', triton.__version__)" 2>&1 | tail -1

step "engine build, mode default, batch 1,2,4,128 (first build: empty cache)"
timeout 200 $PY -m server engine build --device $DEVICE --batch-sizes 1,2,4,128 --compile-mode default \
  --compile-cache-dir "$CACHE" --json "$OUT/build_default.json" 2>&1 | grep -v "^$" | tail -14

step "bench model: eager fp32, eager fp16 graphs, compiled (default mode; warm cache)"
COMPILE=on; [ "$DEVICE" = cpu ] && COMPILE=off
timeout 150 $PY -m server bench model --device $DEVICE --batch-sizes $SIZES --iters $ITERS \
  --compile $COMPILE --compile-mode default --compile-cache-dir "$CACHE" \
  --json "$OUT/bench_model.json" 2>&1 | grep -v " INFO " | tail -14

step "cold start to ready (wav2lip, compile on, warm cache), adaptive jitter buffer"
$PY -c "import torch; from pipeline.wav2lip.model import Wav2Lip; torch.save({'state_dict': Wav2Lip().state_dict()}, '/tmp/w2l.pth')"
serve_probe() {  # $1 tag, $2 probe video-release modes (comma-separated), rest: extra serve flags
  local tag=$1 releases=$2; shift 2
  local t0 t1
  t0=$(date +%s.%N)
  timeout 150 $PY -m server serve --backend wav2lip --checkpoint /tmp/w2l.pth --device $DEVICE --port 8091 \
    --ice-address 127.0.0.1 --media-workers 1 --batch-sizes $SERVE_SIZES --wav2lip-compile-mode default \
    --compile-cache-dir "$CACHE" "$@" > "$OUT/serve_$tag.log" 2>&1 &
  local server=$!
  for _ in $(seq 1 1200); do
    curl -sf http://127.0.0.1:8091/readyz >/dev/null 2>&1 && break
    kill -0 $server 2>/dev/null || break
    sleep 0.1
  done
  t1=$(date +%s.%N)
  $PY -c "print(f'$tag: ready after {$t1 - $t0:.2f} s')" | tee -a "$OUT/ready.txt"
  grep -E "render budget|compile cache|compiled kernels|fp16|another environment|torch.compile|Error" \
    "$OUT/serve_$tag.log" | cut -c1-200 | tail -6
  for release in ${releases//,/ }; do
    echo "--- probe $tag, video release $release"
    timeout 60 $PY -m server probe http://127.0.0.1:8091 --ice-address 127.0.0.1 --video-release $release \
      --json "$OUT/probe_${tag}_$release.json" 2>&1 | tail -20 | tee -a "$OUT/probes.txt"
  done
  kill $server; wait $server 2>/dev/null
}
serve_probe adaptive aiortc,marker --jitter-buffer-ms adaptive
if [ "$(left)" -gt 150 ]; then
  step "fixed 60 ms jitter buffer (the default)"
  serve_probe fixed60 aiortc
fi
if [ "$(left)" -gt 150 ]; then
  step "training alignment (160 ms lookahead), adaptive jitter buffer"
  serve_probe training marker --jitter-buffer-ms adaptive --wav2lip-alignment training
fi

if [ "$DEVICE" = cuda ] && [ "$(left)" -gt 60 ]; then
  step "GPU tests (compiled vs eager fp32 on the warm cache)"
  LIPCAST_COMPILE_CACHE_DIR="$CACHE" LIPCAST_WAV2LIP_COMPILE_MODE=default timeout $(( $(left) < 120 ? $(left) - 20 : 100 )) \
    $PY -m pytest -q -m gpu tests/pipeline/test_wav2lip_compile.py tests/pipeline/test_wav2lip_backend.py \
    -p no:cacheprovider 2>&1 | tail -4
fi

if [ "$DEVICE" = cuda ] && [ "$(left)" -gt 90 ]; then
  step "engine build, mode max-autotune-no-cudagraphs, batch 128 (first build)"
  timeout $(( $(left) - 50 )) $PY -m server engine build --device $DEVICE --batch-sizes 128 \
    --compile-cache-dir "$CACHE" --json "$OUT/build_autotune.json" 2>&1 | grep -v "^$" | tail -6
  if [ -f "$OUT/build_autotune.json" ] && [ "$(left)" -gt 25 ]; then
    step "bench model, compiled max-autotune, batch 128"
    timeout $(( $(left) - 5 )) $PY -m server bench model --device $DEVICE --batch-sizes 128 --iters $ITERS \
      --compile on --compile-cache-dir "$CACHE" --json "$OUT/bench_autotune.json" 2>&1 | grep -v " INFO " | tail -5
  fi
fi
step done
