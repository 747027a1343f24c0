#!/usr/bin/env bash
# Issue 27 on the GPU device: one Wav2Lip call (random weights, the server's defaults) clean and with 2 %
# random uplink loss inside the probe's transport, per seed; the probe's summaries and JSON in $OUT.
#   bash benchmarks/w2l_networks.sh                      # on the GPU device
#   DEVICE=cpu DURATION_S=5 SEEDS=1 bash benchmarks/w2l_networks.sh   # a dry run here
set -u
OUT=${OUT:-/tmp/w2l-networks}
mkdir -p "$OUT"
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
DURATION_S=${DURATION_S:-30}
SEEDS=${SEEDS:-1 2}
PORT=${PORT:-8093}
$PY -c "import torch; from lipcast.pipeline.wav2lip.model import Wav2Lip; torch.save({'state_dict': Wav2Lip().state_dict()}, '/tmp/w2l.pth')"
$PY -m lipcast serve --backend wav2lip --checkpoint /tmp/w2l.pth --device "$DEVICE" --port "$PORT" \
  --ice-address 127.0.0.1 --media-workers 1 --batch-sizes 1,2,4 > "$OUT/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 1 1800); do
  curl -sf "http://127.0.0.1:$PORT/readyz" > /dev/null 2>&1 && break
  kill -0 $server 2> /dev/null || { tail -20 "$OUT/serve.log"; exit 1; }
  sleep 0.1
done
for seed in $SEEDS; do
  for spec in clean "loss=2%"; do
    impair=()
    [ "$spec" = clean ] || impair=(--impair "$spec" --impair-direction up)
    name=$(printf '%s-%s' "$spec" "$seed" | tr -c 'a-zA-Z0-9=-' '_')
    echo "== $spec seed $seed"
    timeout $((DURATION_S + 60)) $PY -m lipcast probe "http://127.0.0.1:$PORT" --ice-address 127.0.0.1 \
      --duration-s "$DURATION_S" --seed "$seed" --video-release marker "${impair[@]}" \
      --json "$OUT/$name.json" > "$OUT/$name.txt" 2>&1
    grep -E "server inbound|audio in -> audio out|fps:|audio returned|mouth follows|impaired" "$OUT/$name.txt"
  done
done
