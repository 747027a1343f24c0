#!/usr/bin/env bash
# Sessions per box with media workers: the server pinned to 10 cores, the probe's clients to the other 6
# (taskset), a ramp of concurrent calls per step: issue 11's, 8 16 24 32 40 48 sessions for 60 s each, after a
# short one-session reference step. One backend per invocation, so that one device command (<= 600 s) holds
# a whole ramp: the default is Wav2Lip (random weights) on the GPU; the built-in backend is a second command.
# A step starts only if it can end before LIMIT_S (STEP_S + STEP_OVERHEAD_S from its start); the others are
# listed as skipped. Results (probe JSON per step, server logs, a summary) under $OUT.
#
#   benchmarks/media_workers_ramp.sh                    # device command 1: Wav2Lip, 8..48 sessions, 60 s each
#   BACKENDS=builtin benchmarks/media_workers_ramp.sh   # device command 2: the built-in backend
#   STEPS="1 2" STEP_S=4 WORKERS=2 SERVER_CPUS=0 CLIENT_CPUS=1 DEVICE=cpu BACKENDS=builtin \
#     benchmarks/media_workers_ramp.sh                  # a smoke test on a small CPU box
set -u
RESULTS=${OUT:-/tmp/media_ramp}  # only summary.txt, processes.txt and probes.tgz go here (the device returns 8 files)
OUT=$(mktemp -d /tmp/media_ramp_work.XXXX)
mkdir -p "$RESULTS"
PY=${PY:-python3}
STEPS=${STEPS:-"8 16 24 32 40 48"}
STEP_S=${STEP_S:-60}          # seconds of audio per call at each step (the issue's 60)
ONE_SESSION_S=${ONE_SESSION_S:-20}  # the one-session reference step: enough bursts for its latency p50
STEP_OVERHEAD_S=${STEP_OVERHEAD_S:-25}  # a step's time beyond STEP_S: connecting, the ramp, analysis, summary
LIMIT_S=${LIMIT_S:-585}       # the whole command, from the script's start (the device's limit is 600 s)
WORKERS=${WORKERS:-12}        # media workers over the 10 server cores: 3-4 calls each at 40-48 calls
SERVER_CPUS=${SERVER_CPUS:-0-9}
CLIENT_CPUS=${CLIENT_CPUS:-10-15}
CLIENT_PROCS=${CLIENT_PROCS:-6}
DEVICE=${DEVICE:-cuda}
BACKENDS=${BACKENDS:-wav2lip}  # one per device command (a whole 60 s ramp takes ~8 min)
ONE_SESSION=${ONE_SESSION:-1}  # 1: a one-session step first (the reference latency)
VARIANTS=${VARIANTS:-}        # extra steps after the ramp, SESSIONS:CLIENT_PROCESSES (e.g. "40:12")
RENDER_IN=${RENDER_IN:-auto}  # --render-in of the server (auto: built-in on a CPU renders in each worker)
PORT=${PORT:-8093}
START=$(date +%s)

HERE=$(cd "$(dirname "$0")" && pwd)
summary() {  # one line per step: the probe's figures, CPU per process, engine, GPU utilisation
  $PY "$HERE/ramp_summary.py" "$@"
}

if [ "$DEVICE" = cuda ]; then
  $PY -c "import torch; from pipeline.wav2lip.model import Wav2Lip; torch.save({'state_dict': Wav2Lip().state_dict()}, '/tmp/w2l_random.pth')"
fi
for backend in $BACKENDS; do
  extra=()
  if [ "$backend" = wav2lip ]; then extra=(--checkpoint /tmp/w2l_random.pth); fi
  taskset -c "$SERVER_CPUS" $PY -m lipcast serve --backend "$backend" "${extra[@]}" --device "$DEVICE" \
    --port "$PORT" --max-sessions 64 --media-workers "$WORKERS" --render-in "$RENDER_IN" \
    --ice-address 127.0.0.1 --log-level WARNING \
    > "$OUT/serve_$backend.log" 2>&1 &
  SERVER=$!
  for i in $(seq 1 1800); do curl -sf "http://127.0.0.1:$PORT/readyz" > /dev/null 2>&1 && break; sleep 0.1; done
  echo "$backend: server ready $(( $(date +%s) - START )) s after the start" | tee -a "$OUT/summary.txt"
  curl -s "http://127.0.0.1:$PORT/healthz" > "$OUT/healthz_$backend.json"
  first=1
  [ "$ONE_SESSION" = 1 ] || first=
  steps_var="STEPS_${backend^^}"  # STEPS_WAV2LIP / STEPS_BUILTIN: this backend's own steps
  for step in $first ${!steps_var:-$STEPS} $VARIANTS; do
    n=${step%%:*}
    procs=$(( n < CLIENT_PROCS ? 1 : CLIENT_PROCS ))
    if [ "$step" != "$n" ]; then procs=${step#*:}; n="${n}p$procs"; fi  # a variant: n:client processes
    duration=$STEP_S
    if [ -n "$first" ] && [ "$n" = 1 ]; then duration=$ONE_SESSION_S; first=; fi
    left=$(( LIMIT_S - ($(date +%s) - START) ))
    if [ "$left" -lt $(( duration + STEP_OVERHEAD_S )) ]; then
      echo "$backend $n: skipped (${left} s left, a step takes $(( duration + STEP_OVERHEAD_S )))" \
        | tee -a "$OUT/summary.txt"
      continue
    fi
    gpu="$OUT/gpu_${backend}_$n.csv"
    SMI=
    if command -v nvidia-smi > /dev/null; then
      nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 500 > "$gpu" &
      SMI=$!
    fi
    step_start=$(date +%s)
    timeout $(( left - 5 )) taskset -c "$CLIENT_CPUS" $PY -m lipcast probe "http://127.0.0.1:$PORT" \
      --ice-address 127.0.0.1 --sessions "${n%%p*}" --client-processes "$procs" --ramp-s 2 --duration-s "$duration" \
      --json "$OUT/probe_${backend}_$n.json" > "$OUT/probe_${backend}_$n.txt" 2>&1
    if [ -n "$SMI" ]; then kill "$SMI"; wait "$SMI" 2> /dev/null; fi
    summary "$OUT/probe_${backend}_$n.json" "$backend" "$n" "$gpu" | tee -a "$OUT/summary.txt"
    { echo "== $backend, $n session(s)"; sed -n '/server CPU/,$p' "$OUT/probe_${backend}_$n.txt"; } \
      >> "$OUT/processes.txt"
    echo "$backend $n: step of $(( $(date +%s) - step_start )) s ended at $(( $(date +%s) - START )) s" \
      >> "$OUT/processes.txt"
  done
  curl -s "http://127.0.0.1:$PORT/metrics" > "$OUT/metrics_$backend.txt"
  kill -TERM "$SERVER"; wait "$SERVER"
done
(cd "$OUT" && tar -czf "$RESULTS/probes.tgz" probe_*.json probe_*.txt healthz_*.json gpu_*.csv metrics_*.txt \
  serve_*.log 2>/dev/null)
cp "$OUT/summary.txt" "$OUT/processes.txt" "$RESULTS/" 2>/dev/null
ls "$RESULTS"
