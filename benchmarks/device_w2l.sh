#!/usr/bin/env bash
# Issue 12 on the device (H200): GPU tests, model bench (eager fp32 vs fp16 graphs) at batch 1 and 128, cold
# start to ready (wav2lip, random weights), and one Wav2Lip session measured with `lipcast probe` (derived
# render budget, adaptive jitter buffer). Results in $OUT. Usage: bash benchmarks/device_w2l.sh [tiny]
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/w2l-out}
mkdir -p "$OUT"
DEVICE=cuda; SIZES=1,128; ITERS=50
if [ "${1:-}" = tiny ]; then DEVICE=cpu; SIZES=1; ITERS=2; fi
PY=${PY:-python3}
step() { echo "=== $* ($(date +%T))"; }
step environment
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null | tee "$OUT/gpu.txt"
$PY -c "import torch; print(torch.__version__, torch.version.cuda)"
if [ "$DEVICE" = cuda ]; then
  step "GPU tests"
  timeout 150 $PY -m pytest -q -m gpu tests/pipeline -p no:cacheprovider 2>&1 | tail -3
fi
step "bench model"
timeout 150 $PY -m server bench model --device $DEVICE --batch-sizes $SIZES --iters $ITERS \
  --json "$OUT/bench_model.json" 2>&1 | tail -12
step "cold start to ready (wav2lip)"
$PY -c "import torch; from pipeline.wav2lip.model import Wav2Lip; torch.save({'state_dict': Wav2Lip().state_dict()}, '/tmp/w2l.pth')"
t0=$(date +%s.%N)
timeout 200 $PY -m server serve --backend wav2lip --checkpoint /tmp/w2l.pth --device $DEVICE --port 8091 \
  --ice-address 127.0.0.1 > "$OUT/serve_w2l.log" 2>&1 &
SERVER=$!
for i in $(seq 1 1200); do
  curl -sf http://127.0.0.1:8091/readyz >/dev/null 2>&1 && break
  sleep 0.1
done
t1=$(date +%s.%N)
$PY -c "print(f'ready after {$t1 - $t0:.2f} s')" | tee "$OUT/ready.txt"
grep -E "render budget|warm-up|fp16" "$OUT/serve_w2l.log" | tail -4
step "probe: one wav2lip session"
timeout 60 $PY -m server probe http://127.0.0.1:8091 --ice-address 127.0.0.1 --json "$OUT/probe_w2l_1.json" 2>&1 | tail -12
kill $SERVER; wait $SERVER 2>/dev/null
step done
