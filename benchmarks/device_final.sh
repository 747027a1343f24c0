#!/usr/bin/env bash
# The GPU figures of the closing notes, current code: GPU tests, the model benchmark, simulated sessions on
# the engine, and the built-in backend on the device's CPU under 1/4/8 probe sessions. Results in $OUT.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 120 python3 -m pytest -q -m gpu tests/pipeline -p no:cacheprovider 2>&1 | tail -1
timeout 150 python3 -m server bench model --device cuda --batch-sizes 1,2,4,8,16,32,64,128 --iters 50 \
  --json "$OUT/bench_model.json" 2>&1 | grep -E "config|engine_render|eager_fp32_full +float32 +(1|128) "
timeout 200 python3 -m server bench engine --backend wav2lip --device cuda --start 64 --seconds 3 \
  --json "$OUT/bench_engine.json" 2>&1 | tail -10
python3 -m server serve --device cpu --port 8092 --max-sessions 64 --ice-address 127.0.0.1 > /tmp/serve.log 2>&1 &
SERVER=$!
for i in $(seq 1 300); do curl -sf http://127.0.0.1:8092/readyz >/dev/null 2>&1 && break; sleep 0.1; done
for n in 1 4 8; do
  timeout 90 python3 -m server probe http://127.0.0.1:8092 --ice-address 127.0.0.1 --sessions $n --ramp-s 2 \
    --json "/tmp/probe_builtin_$n.json" 2>/dev/null | grep -vE "^\s*$"
done
kill $SERVER
tar -czf "$OUT/probes.tgz" -C /tmp probe_builtin_1.json probe_builtin_4.json probe_builtin_8.json
