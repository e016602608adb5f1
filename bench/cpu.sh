#!/usr/bin/env bash
# CPU benchmark: prefill and decode tokens/s against the memcpy bandwidth of
# the same run, for the tiny model; a larger one (hidden 1024, 24 layers) in
# BF16 and the same weights widened to F32 on disk; a mixture of experts (64
# experts, top 8) against the bandwidth of the weights a token reads; and the
# load time and resident memory of a ~2.7 GB BF16 model against its files.
# Models are generated once under models/ (hpd-mkmodel; not in git).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
mk=./build/tools/hpd-mkmodel
H1024="--hidden 1024 --layers 24 --intermediate 2816 --vocab 16384 --heads 8 --kv-heads 2 \
--head-dim 128 --lin-k-heads 4 --lin-v-heads 8 --lin-k-dim 128 --lin-v-dim 128"
[ -f models/tiny/config.json ] || $mk --out models/tiny --seed 1
[ -f models/h1024/config.json ] || $mk --out models/h1024 --seed 2 $H1024
[ -f models/h1024-f32/config.json ] || $mk --out models/h1024-f32 --seed 2 $H1024 \
    --dtype f32 --round-to bf16
[ -f models/moe64/config.json ] || $mk --out models/moe64 --seed 3 --hidden 1024 --layers 12 \
    --vocab 16384 --heads 8 --kv-heads 2 --head-dim 128 --lin-k-heads 4 --lin-v-heads 8 \
    --lin-k-dim 128 --lin-v-dim 128 --experts 64 --experts-per-tok 8 --moe-intermediate 256 \
    --shared-intermediate 512
[ -f models/h2048/config.json ] || $mk --out models/h2048 --seed 4 --hidden 2048 --layers 24 \
    --intermediate 6144 --vocab 32768 --heads 16 --kv-heads 4 --head-dim 128 --lin-k-heads 8 \
    --lin-v-heads 16 --lin-k-dim 128 --lin-v-dim 128 --shards 4
./build/bench/hpd-bench-cpu "$@" models/tiny models/h1024 models/h1024-f32 models/moe64
./build/bench/hpd-bench-cpu --load-only models/h2048
