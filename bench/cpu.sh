#!/usr/bin/env bash
# CPU benchmark: the tiny model and a larger one (hidden 1024, 24 layers),
# prefill and decode tokens/s against the memcpy bandwidth of the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
mk=./build/tools/hpd-mkmodel
[ -f models/tiny/config.json ] || $mk --out models/tiny --seed 1
[ -f models/h1024/config.json ] || $mk --out models/h1024 --seed 2 --hidden 1024 --layers 24 \
    --intermediate 2816 --vocab 16384 --heads 8 --kv-heads 2 --head-dim 128 \
    --lin-k-heads 4 --lin-v-heads 8 --lin-k-dim 128 --lin-v-dim 128
./build/bench/hpd-bench-cpu "$@" models/tiny models/h1024
