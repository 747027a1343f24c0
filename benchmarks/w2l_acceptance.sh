#!/usr/bin/env bash
# Issue 12's figures on the GPU device (random Wav2Lip weights: no checkpoint here):
#   profile: the engine's whole render at batch 1 and 128: eager fp32 of the whole face (the reference), the
#            fp16 graphs of last round (whole face) and now (rows only), compiled kernels
#            (benchmarks/engine_profile.py);
#   build:   the first build of the compiled kernels, every default bucket, from an empty cache (`engine build`);
#   serve:   cold starts of the server with that (warm) cache, to /readyz, each followed by calls
#            (`lipcast probe`, marker release): one media worker (one call), then the server's defaults (a
#            media worker per core but one; its first call and a second one);
#   tests:   the GPU tests.
# STEPS picks them (default: all). A device command may run 10 minutes, so there it runs as two commands on
# one machine that share WORK (and so the cache):
#   WORK=.w2l-work STEPS="profile build" bash benchmarks/w2l_acceptance.sh
#   WORK=.w2l-work STEPS="serve tests" bash benchmarks/w2l_acceptance.sh
# Results in $OUT (few files: the device returns at most 8; logs and kernel tables in logs.tgz).
# DEVICE=cpu: a dry run.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/w2l-acceptance}
WORK=${WORK:-$(mktemp -d)}
STEPS=${STEPS:-profile build serve tests}
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

has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
logs() { tar -czf "$OUT/logs.tgz" --exclude=compile-cache --exclude="*.pth" -C "$WORK" .; }

if has profile; then
  step "engine profile: batch 1 and 128"
  timeout 300 $PY benchmarks/engine_profile.py --sizes 1,128 --iters 50 --modes default --out "$WORK/profile" \
    2>&1 | grep -E "^\[|Error|failed" | cut -c1-400
  cp "$WORK/profile/engine_profile.json" "$OUT/"
fi

if has build; then
  step "first build of the compiled kernels, every default bucket, empty cache"
  rm -rf "$CACHE"
  t0=$(date +%s.%N)
  timeout 300 $PY -m lipcast engine build --device "$DEVICE" --compile-cache-dir "$CACHE" --json "$OUT/build.json" \
    2>&1 | grep -v "^$" | tail -12
  echo "first build: $(seconds_since "$t0") s (the process, start to exit)" | tee "$OUT/build_time.txt"
fi

serve_probe() {  # $1 tag, $2 calls; the rest: extra serve flags. A cold start with the warm cache, then calls.
  local tag=$1 calls=$2 t0 server call
  shift 2
  step "cold start '$tag' with the warm cache (wav2lip on $DEVICE; flags: $*)"
  t0=$(date +%s.%N)
  # Stalls of 25 ms and more are logged (the default is 100): a first call's one-time work shows there.
  $PY -m lipcast serve --backend wav2lip --checkpoint "$WORK/w2l.pth" --device "$DEVICE" --port "$PORT" \
    --ice-address 127.0.0.1 --compile-cache-dir "$CACHE" --loop-stall-ms 25 "$@" > "$WORK/serve_$tag.log" 2>&1 &
  server=$!
  until curl -sf "http://127.0.0.1:$PORT/readyz" > /dev/null 2>&1; do
    kill -0 $server 2> /dev/null || break
    [ "$($PY -c "import time; print(int(time.time() - $t0))")" -gt "${READY_LIMIT_S:-150}" ] && break
    sleep 0.1
  done
  echo "$tag: ready after $(seconds_since "$t0") s ($(curl -s "http://127.0.0.1:$PORT/readyz" | head -c 160))" \
    | tee -a "$OUT/ready.txt"
  grep -E "compile cache|compiled kernels ready|media worker|render budget|warm-up|warmed|fp16|Error|Traceback" \
    "$WORK/serve_$tag.log" | cut -c1-200 | tail -6
  for call in $(seq 1 "$calls"); do
    step "call $call on '$tag'"
    timeout $((DURATION_S + 40)) $PY -m lipcast probe "http://127.0.0.1:$PORT" --ice-address 127.0.0.1 \
      --duration-s "$DURATION_S" --video-release marker --json "$OUT/probe_${tag}_$call.json" 2>&1 \
      | grep -v " INFO " | head -40
  done
  # A call's latency steps up for seconds after its inbound audio runs dry once: say when, and why.
  grep -c "event loop stalled" "$WORK/serve_$tag.log" | sed "s/^/$tag: event-loop stalls logged: /"
  grep "event loop stalled" "$WORK/serve_$tag.log" | cut -c1-200 | head -5
  grep -c "inbound audio ran dry" "$WORK/serve_$tag.log" | sed "s/^/$tag: underrun lines logged: /"
  grep "inbound audio ran dry" "$WORK/serve_$tag.log" | cut -c1-220 | head -5
  kill $server
  wait $server 2> /dev/null
  logs
}
if has serve; then
  $PY -c "import sys, torch; from pipeline.wav2lip.model import Wav2Lip
torch.save({'state_dict': Wav2Lip().state_dict()}, sys.argv[1])" "$WORK/w2l.pth"
  serve_probe one_worker 1 --media-workers 1
  serve_probe defaults 2
fi

if has tests; then
  step "GPU tests"
  LIPCAST_COMPILE_CACHE_DIR="$CACHE" timeout 150 $PY -m pytest -q -m gpu tests/pipeline -p no:cacheprovider \
    2>&1 | tail -2
fi
logs
step done
