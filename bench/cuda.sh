#!/bin/bash
# The GPU benchmarks (issue 7), on a machine with a GPU:
#   bash bench/cuda.sh [BUILD_DIR]
# (run in the order 2, 1, 3: fla's figures first, as a deadline may cut the
# model's)
# 1. hpd-bench-cuda: copy bandwidth, GDN decode step and paged-attention
#    decode against it, chunked GDN prefill, translation against a copy, the
#    GEMM of decode (gemv) against the copy bandwidth and of prefill (gemm)
#    beside cuBLAS, attention over a prompt of 2 x PREFILL tokens against
#    cuBLAS's TFLOP/s, and a model with Qwen3-Next's dimensions (8 layers,
#    random weights);
# 2. flash-linear-attention's fused_recurrent / chunk gated delta rule on the
#    same shapes (wheels in .fla-wheels from tools/fetch-fla-wheels.sh,
#    installed into a temporary folder beside the machine's torch and Triton);
# 3. the ratio fla time / our time per kernel (> 1: ours is faster).
set -euo pipefail
cd "$(dirname "$0")/.."
# the model's decode with steps recorded as CUDA graphs (the default), and
# without (model_decode_ops)
export HPD_CUDA_GRAPHS=${HPD_CUDA_GRAPHS:-1}
build=${1:-build}
seqs=${SEQS:-32} context=${CONTEXT:-4096} prefill=${PREFILL:-4096}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# fla first: its figures land even where a deadline cuts the model's
echo "== flash-linear-attention"
py=python3
if [ -d .fla-wheels ]; then
  # installed beside the machine's own torch and Triton (a venv made from
  # python3 may not see them where python3 is itself a venv's)
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$out/fla-site" \
    .fla-wheels/*.whl
  export PYTHONPATH=$out/fla-site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! err=$("$py" -c 'import fla.ops.gated_delta_rule' 2>&1); then
  echo "flash-linear-attention is not importable (run tools/fetch-fla-wheels.sh and carry" \
       ".fla-wheels): no side-by-side figures"
  echo "$err" | tail -3
else
  "$py" bench/fla_gdn.py --seqs "$seqs" --prefill "$prefill" | tee "$out/fla.txt"
fi

model=${MODEL_DIR:-$out/qwen3-next-dims}
if [ ! -f "$model/config.json" ]; then
  echo "== generating a model with Qwen3-Next's dimensions (8 layers, random weights)"
  "$build/tools/hpd-mkmodel" --out "$model" --arch qwen3_next --hidden 2048 --layers 8 \
    --full-interval 4 --intermediate 5120 --vocab 151936 --heads 16 --kv-heads 2 \
    --head-dim 256 --lin-k-heads 16 --lin-v-heads 32 --lin-k-dim 128 --lin-v-dim 128
fi

echo "== hpd-bench-cuda"
"$build/bench/hpd-bench-cuda" --device "${DEVICE:-cuda:0}" --seqs "$seqs" --context "$context" \
  --prefill "$prefill" --model "$model" | tee "$out/ours.txt"


[ -s "$out/fla.txt" ] || exit 0
echo "== side by side (ratio = fla ms / hpd ms; > 1: hpd is faster)"
field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p"; }
ours_rec=$(grep "^gdn_recurrent seqs=$seqs " "$out/ours.txt" | field ms)
for dt in f32 bf16; do
  fla_rec=$(grep "^fla_gdn_recurrent dtype=$dt" "$out/fla.txt" | field ms)
  awk -v a="$fla_rec" -v b="$ours_rec" -v d="$dt" -v s="$seqs" 'BEGIN {
    printf "gdn_recurrent seqs=%s: hpd f32 %.4f ms, fla %s %.4f ms, ratio %.2f\n", s, b, d, a, a / b }'
  for n in 1 4; do
    line=$(grep "^gdn_chunked seqs=$n " "$out/ours.txt")
    fla=$(grep "^fla_gdn_chunked dtype=$dt seqs=$n " "$out/fla.txt" | field ms)
    # hpd's fp32 rule beside fla's f32, cuda-bf16's beside fla's bf16
    if [ "$dt" = f32 ]; then hd=f32; ours=$(echo "$line" | field ms)
    else hd=cuda-bf16; ours=$(echo "$line" | field bf16_device_ms); fi
    [ -n "$ours" ] || continue
    awk -v a="$fla" -v b="$ours" -v d="$dt" -v n="$n" -v t="$prefill" -v h="$hd" 'BEGIN {
      printf "gdn_chunked seqs=%s tokens=%s: hpd %s %.3f ms, fla %s %.3f ms, ratio %.2f\n", n, t, h, b, d, a, a / b }'
  done
done
