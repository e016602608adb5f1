#!/usr/bin/env bash
# From a fresh clone: installs the packages, builds, writes the tiny random
# model and generates from it with hpd-run.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
bash scripts/build.sh
model=models/tiny
[ -f "$model/config.json" ] || ./build/tools/hpd-mkmodel --out "$model" --seed 1
prompt=$(seq -s, 1 100)
echo "== hpd-run: 100-token prompt, 32 greedy tokens"
./build/tools/hpd-run --model "$model" --prompt-ids "$prompt" --max-tokens 32
echo "== hpd-run: the same prompt, sampled (temperature 0.8, top-p 0.9, seed 7)"
./build/tools/hpd-run --model "$model" --prompt-ids "$prompt" --max-tokens 32 \
    --temperature 0.8 --top-p 0.9 --seed 7
