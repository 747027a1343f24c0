#!/usr/bin/env bash
# Issue 29's acceptance figures on the GPU device, random weights of the published configuration:
#   build:  full-size random weights written in the published layout, a 512 px avatar, then a server start
#           with --musetalk-compile on and an empty compile cache, to /readyz: the first build's time;
#   bench:  the reference step (diffusers UNet + vae.decode, eager fp16) beside the engine, eager (row and
#           full decode) and with the compiled kernels (built into the same cache, or loaded when build
#           ran), batch BENCH_SIZES (1,8,32), each engine's patches against the eager full decode's
#           (benchmarks/musetalk_bench.py; BENCH_ARGS: more of its options);
#   serve:  a cold start with that (warm) cache, to /readyz; one call (generated bursts, marker release):
#           audio in -> mouth moves at the default lookahead (80 ms); then RAMP steps of continuously
#           speaking calls (a voiced signal without pauses), STEP_S each: fps, frame gaps, audio returned;
#   tests:  the `gpu`-marked MuseTalk tests.
# STEPS picks them (default: all, in that order). A device command may run 10 minutes; there:
#   STEPS="bench serve" BENCH_SIZES=1,32 BENCH_ARGS=--only-compiled bash benchmarks/musetalk_acceptance.sh
#   (the bench builds the kernels every bucket uses: batch 1's and the symbolic batch's; the server then
#   starts warm), or with a first build of its own: STEPS="build bench serve"; STEPS=tests apart.
# aiortc, av and webrtcvad come from WHEELS (a folder of wheels) when they are not installed.
# Results in $OUT (summary.txt, JSON, logs.tgz). On a small CPU box, a dry run:
#   DEVICE=cpu TINY=1 RAMP=2 STEP_S=6 SERVER_CPUS=0 CLIENT_CPUS=1 WORKERS=1 STEPS="build serve" bash ...
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # benchmarks/*.py import lipcast from the checkout
OUT=${OUT:-/tmp/musetalk-acceptance}
WORK=${WORK:-$(mktemp -d)}
STEPS=${STEPS:-build bench serve tests}
PY=${PY:-python3}
PORT=${PORT:-8094}
DEVICE=${DEVICE:-cuda}
RAMP=${RAMP:-16 24}
STEP_S=${STEP_S:-30}
ONE_CALL_S=${ONE_CALL_S:-20}
LIMIT_S=${LIMIT_S:-590}   # the whole command; a ramp step starts only if it can end before this
TINY=${TINY:-}
WHEELS=${WHEELS:-}
SERVER_CPUS=${SERVER_CPUS:-0-9}   # as media_workers_ramp.sh: the server on 10 cores, the probe's clients on 6
CLIENT_CPUS=${CLIENT_CPUS:-10-15}
WORKERS=${WORKERS:-10}
CACHE=$WORK/compile-cache
START=$(date +%s)
mkdir -p "$OUT" "$WORK"
step() { echo "=== $* ($(date +%T), +$(($(date +%s) - START)) s)" | tee -a "$OUT/summary.txt"; }
note() { echo "$*" | tee -a "$OUT/summary.txt"; }
seconds_since() { $PY -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$1"; }
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
logs() { tar -czf "$OUT/logs.tgz" --exclude=compile-cache --exclude=weights --exclude="*.wav" -C "$WORK" .; }

step "environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$OUT/summary.txt"
$PY -c "import torch, diffusers, transformers; print('torch', torch.__version__, 'diffusers', diffusers.__version__,
'transformers', transformers.__version__)" | tee -a "$OUT/summary.txt"
{ [ -f COMMIT ] && sed 's/^/commit /' COMMIT || git log -1 --format='commit %h'; } | tee -a "$OUT/summary.txt"

if has build || has serve; then
  $PY -c "import aiortc, av, webrtcvad" 2> /dev/null \
    || { [ -n "$WHEELS" ] && $PY -m pip install -q --no-deps "$WHEELS"/*.whl 2>&1 | tail -2; }
fi

if has build || has serve; then
  step "weights (random, published layout), a 512 px avatar, continuous speech"
  $PY - "$WORK" "${TINY:-}" "$STEP_S" << 'EOF'
import sys, wave
from pathlib import Path

import cv2
import numpy as np

from lipcast.pipeline.avatar import BUILTIN_AVATAR_DIR, Avatar, load_avatar, write_avatar
from lipcast.pipeline.musetalk.config import full_configs, tiny_configs
from lipcast.pipeline.musetalk.weights import random_models, write_checkpoint

work, tiny, seconds = Path(sys.argv[1]), bool(sys.argv[2]), float(sys.argv[3])
write_checkpoint(random_models(tiny_configs() if tiny else full_configs()), work / "weights")
base, side = load_avatar(BUILTIN_AVATAR_DIR / "astronaut"), 512
scale = side / base.width
frames = np.stack([cv2.resize(f, (side, side), interpolation=cv2.INTER_CUBIC) for f in base.frames])
eyes = None if base.eyes is None else (base.eyes * scale).astype(np.float32)
big = Avatar("astronaut512", base.fps, frames, np.round(base.face_boxes * scale).astype(np.int32),
             (base.mouths * scale).astype(np.float32), eyes=eyes)
write_avatar(big, work / "avatars" / "astronaut512")
# a talker without pauses: a 120-160 Hz voiced harmonic series under a 4 Hz syllable envelope that never
# reaches zero, so the voice activity detector keeps every call speaking
rate = 16000
t = np.arange(round(rate * seconds)) / rate
pitch = 140 + 20 * np.sin(2 * np.pi * 0.7 * t)
phase = 2 * np.pi * np.cumsum(pitch) / rate
voice = sum(np.sin(k * phase) / k for k in range(1, 8))
envelope = 0.35 + 0.65 * np.sin(2 * np.pi * 4.0 * t) ** 2
samples = (0.3 * voice * envelope / np.abs(voice).max() * 32767 * 0.9).astype(np.int16)
with wave.open(str(work / "speech.wav"), "wb") as w:
    w.setnchannels(1), w.setsampwidth(2), w.setframerate(rate), w.writeframes(samples.tobytes())
print("weights, avatar astronaut512 and speech.wav written")
EOF
fi

serve() {  # $1 tag; the rest: extra serve flags. Starts the server, waits for /readyz, notes the time.
  local tag=$1 t0
  shift
  t0=$(date +%s.%N)
  taskset -c "$SERVER_CPUS" $PY -m lipcast serve --backend musetalk --musetalk-weights "$WORK/weights" --device "$DEVICE" --port "$PORT" \
    --avatar-dir "$WORK/avatars" --avatar astronaut512 --max-sessions 40 --ice-address 127.0.0.1 \
    --compile-cache-dir "$CACHE" --media-workers "$WORKERS" "$@" > "$WORK/serve_$tag.log" 2>&1 &
  SERVER=$!
  until curl -sf "http://127.0.0.1:$PORT/readyz" > /dev/null 2>&1; do
    kill -0 $SERVER 2> /dev/null || break
    [ "$($PY -c "import time; print(int(time.time() - $t0))")" -gt "${READY_LIMIT_S:-400}" ] && break
    sleep 0.2
  done
  note "$tag: ready after $(seconds_since "$t0") s ($(curl -s "http://127.0.0.1:$PORT/readyz" | head -c 200))"
  grep -E "compile|compiled kernels|fp16|warm-up|render budget|Error|Traceback" "$WORK/serve_$tag.log" \
    | cut -c1-220 | tail -8 | tee -a "$OUT/summary.txt"
}
stop() {
  kill -TERM "$SERVER" 2> /dev/null
  wait "$SERVER" 2> /dev/null
}

if has build; then
  step "first build: --musetalk-compile on, empty compile cache"
  rm -rf "$CACHE"
  serve first_build --musetalk-compile on
  stop
  logs
fi

if has bench; then
  step "step benchmark: reference beside the engine (eager and compiled), batch ${BENCH_SIZES:-1,8,32}"
  tiny=()
  [ -n "$TINY" ] && tiny=(--tiny)
  left=$((LIMIT_S - ($(date +%s) - START) - 10))
  timeout $left $PY benchmarks/musetalk_bench.py "${tiny[@]}" --sizes "${BENCH_SIZES:-1,8,32}" --iters 20 \
    --compile-cache "$CACHE" ${BENCH_ARGS:-} --json "$OUT/bench.json" 2>&1 | grep -E "^\[|Error|Traceback" \
    | cut -c1-300 | tee -a "$OUT/summary.txt"
fi

if has serve; then
  step "cold start with the warm compile cache"
  serve warm
  step "one call: audio in -> mouth moves (default lookahead)"
  timeout $((ONE_CALL_S + 40)) taskset -c "$CLIENT_CPUS" $PY -m lipcast probe "http://127.0.0.1:$PORT" --ice-address 127.0.0.1 \
    --duration-s "$ONE_CALL_S" --video-release marker --json "$OUT/probe_one.json" 2>&1 | grep -v " INFO " \
    | head -30 > "$WORK/probe_one.txt"
  $PY benchmarks/ramp_summary.py "$OUT/probe_one.json" musetalk 1 | tee -a "$OUT/summary.txt"
  for n in $RAMP; do
    left=$((LIMIT_S - ($(date +%s) - START)))
    if [ "$left" -lt $((STEP_S + 30)) ]; then
      note "ramp $n: skipped ($left s left)"
      continue
    fi
    step "ramp: $n continuously speaking calls, $STEP_S s"
    gpu="$WORK/gpu_$n.csv"
    nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 500 > "$gpu" 2> /dev/null &
    smi=$!
    procs=$(((n + 2) / 3))  # 512 px: a client process decodes about 3 calls' video in real time
    [ "$procs" -gt 6 ] && procs=6
    timeout $((left - 5)) taskset -c "$CLIENT_CPUS" $PY -m lipcast probe "http://127.0.0.1:$PORT" --ice-address 127.0.0.1 \
      --sessions "$n" --client-processes "$procs" --ramp-s 2 --duration-s "$STEP_S" --wav "$WORK/speech.wav" \
      --json "$OUT/probe_ramp_$n.json" > "$WORK/probe_ramp_$n.txt" 2>&1
    kill $smi 2> /dev/null
    $PY benchmarks/ramp_summary.py "$OUT/probe_ramp_$n.json" musetalk "$n" "$gpu" | tee -a "$OUT/summary.txt"
  done
  curl -s "http://127.0.0.1:$PORT/metrics" > "$WORK/metrics.txt"
  stop
  grep -c "event loop stalled" "$WORK/serve_warm.log" | sed "s/^/event-loop stalls logged: /" | tee -a "$OUT/summary.txt"
  logs
fi
if has tests; then
  step "GPU tests"
  timeout 150 $PY -m pytest -q -s -m gpu tests/pipeline -k musetalk -p no:cacheprovider 2>&1 \
    | grep -E "vs|passed|failed|Error|assert" | cut -c1-300 | tee -a "$OUT/summary.txt"
fi

step done
