#!/usr/bin/env bash
# Tensor parallelism on the CPU (issue 37; docs/tensor_parallel.md): TP 2
# with one rank a thread against TP 1 with both threads, and the canonical
# sum against one GEMM a row-parallel product (--tp-fast), in one run on the
# same cores. The model (hidden 1024, 24 layers, BF16, as bench/cpu.sh's)
# is generated once under models/ (not in git).
#   bash bench/tp.sh [hpd-bench-tp options]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
mk=./build/tools/hpd-mkmodel
H1024="--hidden 1024 --layers 24 --intermediate 2816 --vocab 16384 --heads 8 --kv-heads 2 \
--head-dim 128 --lin-k-heads 4 --lin-v-heads 8 --lin-k-dim 128 --lin-v-dim 128"
[ -f models/h1024/config.json ] || $mk --out models/h1024 --seed 2 $H1024
./build/bench/hpd-bench-tp "$@" models/h1024
