#!/usr/bin/env bash
# Sessions per box at HD sizes (issue 28), in one device command: the server (Wav2Lip, random weights, on the
# GPU; or BACKEND=builtin) with media workers pinned to SERVER_CPUS, the probe's clients to CLIENT_CPUS, and one
# step per entry of STEPS, each SESSIONS:AVATAR:SIZE:CODEC, e.g. the default
#   "32:astronaut-512p:512x512:h264 32:astronaut-720p:1280x720:h264 12:astronaut-1080p:1920x1080:h264"
# (the built-in avatar's scenes at those sizes, --builtin-hd-sizes). Each step: that many concurrent calls for
# STEP_S seconds of audio (the probe: fps, frame gaps, server CPU per process). Results under $OUT:
# summary.txt (one line a step), processes.txt (CPU per process), probes.tgz (the probe's JSON and logs).
#
#   OUT=/tmp/hd bash benchmarks/hd_sessions.sh
#   DEVICE=cpu BACKEND=builtin WORKERS=1 SERVER_CPUS=0 CLIENT_CPUS=1 CLIENT_PROCS=1 \
#     STEPS="1:astronaut-720p:1280x720:h264" STEP_S=10 bash benchmarks/hd_sessions.sh   # the box's one call
set -u
RESULTS=${OUT:-/tmp/hd_sessions}
WORK=$(mktemp -d /tmp/hd_sessions_work.XXXX)
mkdir -p "$RESULTS"
PY=${PY:-python3}
STEPS=${STEPS:-"32:astronaut-512p:512x512:h264 32:astronaut-720p:1280x720:h264 12:astronaut-1080p:1920x1080:h264"}
SIZES=${SIZES:-512x512,1280x720,1920x1080}  # --builtin-hd-sizes
STEP_S=${STEP_S:-20}
STEP_OVERHEAD_S=${STEP_OVERHEAD_S:-30}
LIMIT_S=${LIMIT_S:-560}
WORKERS=${WORKERS:-12}
SERVER_CPUS=${SERVER_CPUS:-0-9}
CLIENT_CPUS=${CLIENT_CPUS:-10-15}
CLIENT_PROCS=${CLIENT_PROCS:-6}
DEVICE=${DEVICE:-cuda}
BACKEND=${BACKEND:-wav2lip}
PORT=${PORT:-8095}
START=$(date +%s)
HERE=$(cd "$(dirname "$0")" && pwd)

echo "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(cat COMMIT 2>/dev/null || git rev-parse --short HEAD)" \
  | tee "$RESULTS/summary.txt"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$RESULTS/summary.txt"
extra=()
if [ "$BACKEND" = wav2lip ]; then
  $PY -c "import torch; from pipeline.wav2lip.model import Wav2Lip; torch.save({'state_dict': Wav2Lip().state_dict()}, '/tmp/w2l_random.pth')"
  extra=(--checkpoint /tmp/w2l_random.pth --wav2lip-compile off)
fi
taskset -c "$SERVER_CPUS" $PY -m lipcast serve --backend "$BACKEND" "${extra[@]}" --device "$DEVICE" \
  --port "$PORT" --max-sessions 64 --media-workers "$WORKERS" --builtin-hd-sizes "$SIZES" \
  --ice-address 127.0.0.1 --log-level WARNING > "$WORK/serve.log" 2>&1 &
SERVER=$!
for i in $(seq 1 2400); do curl -sf "http://127.0.0.1:$PORT/readyz" > /dev/null 2>&1 && break; sleep 0.1; done
echo "server ready $(( $(date +%s) - START )) s after the start ($WORKERS media workers, $BACKEND on $DEVICE)" \
  | tee -a "$RESULTS/summary.txt"
for step in $STEPS; do
  IFS=: read -r n avatar size codec <<< "$step"
  left=$(( LIMIT_S - ($(date +%s) - START) ))
  if [ "$left" -lt $(( STEP_S + STEP_OVERHEAD_S )) ]; then
    echo "$step: skipped (${left} s left)" | tee -a "$RESULTS/summary.txt"
    continue
  fi
  procs=$(( n < CLIENT_PROCS ? n : CLIENT_PROCS ))
  tag="${n}_${size}_${codec}"
  gpu="$WORK/gpu_$tag.csv"
  SMI=
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 500 > "$gpu" &
    SMI=$!
  fi
  timeout $(( left - 5 )) taskset -c "$CLIENT_CPUS" $PY -m lipcast probe "http://127.0.0.1:$PORT" \
    --ice-address 127.0.0.1 --sessions "$n" --client-processes "$procs" --ramp-s 2 --duration-s "$STEP_S" \
    --avatar "$avatar" --size "$size" --codec "$codec" --json "$WORK/probe_$tag.json" > "$WORK/probe_$tag.txt" 2>&1
  if [ -n "$SMI" ]; then kill "$SMI"; wait "$SMI" 2> /dev/null; fi
  { echo "== $step"; grep -E "fps|frame gap|late|session failed" "$WORK/probe_$tag.txt" | head -6; } \
    | tee -a "$RESULTS/summary.txt"
  [ -f "$WORK/probe_$tag.json" ] && $PY "$HERE/ramp_summary.py" "$WORK/probe_$tag.json" "$BACKEND" "$tag" "$gpu" \
    | tee -a "$RESULTS/summary.txt"
  { echo "== $step"; sed -n '/server CPU/,$p' "$WORK/probe_$tag.txt"; } >> "$RESULTS/processes.txt"
done
curl -s "http://127.0.0.1:$PORT/metrics" > "$WORK/metrics.txt"
kill -TERM "$SERVER"; wait "$SERVER"
(cd "$WORK" && tar -czf "$RESULTS/probes.tgz" probe_* gpu_*.csv metrics.txt serve.log 2>/dev/null)
ls "$RESULTS"
