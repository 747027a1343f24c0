#!/usr/bin/env bash
# The GPU measurements of the closing notes, in one run on the device (H200): everything it prints and
# writes lands in $OUT. Usage there:  bash benchmarks/device_run.sh
# Needs aiortc/av/webrtcvad wheels in .whl/ (the device image lacks them); torch, numpy, OpenCV and aiohttp
# come with the image.
set -u
FINAL=${OUT:-/tmp/out}
OUT=/tmp/lipcast-results  # everything is gathered here, then packed into $FINAL/results.tgz
mkdir -p "$OUT" "$FINAL"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
PY=python3
step() { echo "=== $* ($(date +%T))"; }

step environment
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch, aiortc, av; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), aiortc.__version__, av.__version__)"

step "GPU tests"
timeout 180 $PY -m pytest -q -m gpu tests/pipeline -p no:cacheprovider 2>&1 | tail -5 | tee "$OUT/gpu_tests.txt"

step "bench model"
timeout 180 $PY -m server bench model --device cuda --batch-sizes 1,2,4,8,16,32,64,128 --iters 50 \
  --json "$OUT/bench_model.json" 2>&1 | tail -30

step "bench engine (wav2lip, random weights, simulated sessions)"
timeout 240 $PY -m server bench engine --backend wav2lip --device cuda --start 64 --seconds 3 \
  --json "$OUT/bench_engine.json" 2>&1 | tail -20

step "cold start to ready (wav2lip on CUDA)"
$PY -c "import torch; from pipeline.wav2lip.model import Wav2Lip; torch.save({'state_dict': Wav2Lip().state_dict()}, '/tmp/w2l.pth')"
t0=$(date +%s.%N)
$PY -m server serve --backend wav2lip --checkpoint /tmp/w2l.pth --device cuda --port 8091 --max-sessions 64 \
  --ice-address 127.0.0.1 > "$OUT/serve_w2l.log" 2>&1 &
SERVER=$!
for i in $(seq 1 600); do
  if curl -sf http://127.0.0.1:8091/healthz 2>/dev/null | grep -q '"ready": true'; then break; fi
  sleep 0.1
done
t1=$(date +%s.%N)
$PY -c "print(f\"ready after {$t1 - $t0:.2f} s\")" | tee "$OUT/ready.txt"
curl -s http://127.0.0.1:8091/healthz | tee "$OUT/healthz_w2l.json"; echo
step "probe wav2lip on GPU: 1 and 8 sessions"
timeout 60 $PY -m server probe http://127.0.0.1:8091 --ice-address 127.0.0.1 --json "$OUT/probe_w2l_1.json"
timeout 90 $PY -m server probe http://127.0.0.1:8091 --ice-address 127.0.0.1 --sessions 8 --ramp-s 2 \
  --json "$OUT/probe_w2l_8.json" | tail -12
kill $SERVER; wait $SERVER 2>/dev/null

step "builtin backend on the device CPU: probe 1, 4, 8, 16 sessions"
$PY -m server serve --device cpu --port 8092 --max-sessions 64 --ice-address 127.0.0.1 > "$OUT/serve_builtin.log" 2>&1 &
SERVER=$!
for i in $(seq 1 300); do curl -sf http://127.0.0.1:8092/healthz >/dev/null 2>&1 && break; sleep 0.1; done
for n in 1 4 8 16; do
  timeout 90 $PY -m server probe http://127.0.0.1:8092 --ice-address 127.0.0.1 --sessions $n --ramp-s 2 \
    --json "$OUT/probe_builtin_$n.json" --png "$OUT/probe_builtin_$n.png" | tail -12
done
kill $SERVER; wait $SERVER 2>/dev/null

step "offline render, wav2lip on CUDA"
$PY -c "
import numpy as np, wave
from server.probe.patterns import burst_pattern
a = burst_pattern(30.0)
w = wave.open('/tmp/speech.wav', 'wb'); w.setnchannels(1); w.setsampwidth(2); w.setframerate(48000)
w.writeframes(a.tobytes()); w.close()"
timeout 120 $PY -m server render --backend wav2lip --device cuda --audio /tmp/speech.wav -o /tmp/render.mp4 2>&1 | tail -2
step done
tar -czf "$FINAL/results.tgz" -C "$OUT" .
