#!/usr/bin/env bash
# hybridpd beside llama.cpp, the CPU engine users pick, on the same model and
# the same threads: builds llama.cpp from the llama-cpp-python sdist on PyPI
# (vendor/llama.cpp), converts the model with its convert_hf_to_gguf.py (BF16
# and F32 GGUF), runs llama-bench and hpd-bench-cpu (devices cpu and
# cpu-bf16) and prints the ratio of prefill and of decode tokens/s
# (hybridpd / llama.cpp).
#
#   bash bench/llamacpp.sh [MODEL_DIR]   (default: models/h1024-q35, made here)
#
# THREADS (2), PROMPT (512), GEN (64), REPS (3: rounds of every engine, the best
# counts); HPD_LLAMACPP_DIR holds the sdist, the
# build, the venv and the GGUF files (/tmp/hpd-llamacpp); PYTHON a Python
# with torch, numpy and safetensors (else a venv is made there).
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-512}
GEN=${GEN:-64}
WORK=${HPD_LLAMACPP_DIR:-/tmp/hpd-llamacpp}
mkdir -p "$WORK"
bash scripts/build.sh > /dev/null
model=${1:-models/h1024-q35}
if [ ! -f "$model/config.json" ]; then
    # Qwen3.5 (dense), the hybrid llama.cpp converts as Qwen3_5ForCausalLM
    ./build/tools/hpd-mkmodel --out "$model" --arch qwen3_5_text --seed 2 --hidden 1024 \
        --layers 24 --intermediate 2816 --vocab 16384 --heads 8 --kv-heads 2 --head-dim 128 \
        --lin-k-heads 4 --lin-v-heads 8 --lin-k-dim 128 --lin-v-dim 128
fi

PY=${PYTHON:-$WORK/venv/bin/python}
if ! "$PY" -c "import torch, numpy, safetensors" 2> /dev/null; then
    python3 -m venv "$WORK/venv"
    PY=$WORK/venv/bin/python
    "$PY" -m pip install -q --index-url https://download.pytorch.org/whl/cpu torch ||
        "$PY" -m pip install -q torch
    "$PY" -m pip install -q numpy safetensors sentencepiece pyyaml
fi
src=$(ls -d "$WORK"/llama_cpp_python-*/vendor/llama.cpp 2> /dev/null | head -1 || true)
if [ -z "$src" ]; then
    "$PY" -m pip download -q --no-deps --no-binary :all: llama-cpp-python -d "$WORK"
    tar xzf "$WORK"/llama_cpp_python-*.tar.gz -C "$WORK"
    src=$(ls -d "$WORK"/llama_cpp_python-*/vendor/llama.cpp | head -1)
fi
bench=$WORK/build/bin/llama-bench
if [ ! -x "$bench" ]; then
    cmake -S "$src" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF > "$WORK/cmake.log"
    cmake --build "$WORK/build" --target llama-bench -j "$(nproc)" > "$WORK/build.log"
fi
name=$(basename "$model")
for t in bf16 f32; do
    gguf=$WORK/$name-$t.gguf
    [ -f "$gguf" ] || "$PY" bench/llamacpp_convert.py "$src" "$model" --outfile "$gguf" --no-mtp \
        --outtype $t > "$WORK/convert-$t.log" 2>&1
done

# REPS rounds (3); each round runs every engine once, one after the other
# (llama.cpp BF16 and F32 through llama-bench, one sample after its warm-up;
# hybridpd with fp32 and with bf16 products), so a disturbance of this shared
# machine falls on all of them alike. The best of the rounds counts for each,
# and each round's own ratio of bf16 products to llama.cpp BF16 is printed.
REPS=${REPS:-3}
# llama.cpp: "prefill decode" tokens/s of one llama-bench sample (pp PROMPT, tg GEN)
ll() {
    "$bench" -m "$1" -t "$THREADS" -p "$PROMPT" -n "$GEN" -r 1 -o json 2> /dev/null |
        "$PY" -c 'import json,sys
rows = json.load(sys.stdin)
pp = [max(r["samples_ts"]) for r in rows if r["n_prompt"] > 0]
tg = [max(r["samples_ts"]) for r in rows if r["n_gen"] > 0]
print(pp[0], tg[0])'
}
# hybridpd on DEVICE (cpu: fp32 products, the bits of transformers' fp32
# forward; cpu-bf16: bf16 products, llama.cpp's arithmetic for BF16
# weights) -> "prefill decode"; the report of round 0 in $WORK/hpd-DEVICE.txt
hpd() {
    local o
    o=$(./build/bench/hpd-bench-cpu --device "$1" --threads "$THREADS" --prompt "$PROMPT" \
        --decode "$GEN" "$model")
    [ "$2" -eq 0 ] && echo "$o" > "$WORK/hpd-$1.txt"
    echo "$o" | awk '/prefill \(/ {pp = $4} /decode batch 1:/ {tg = $4} END {print pp, tg}'
}
max() { awk -v a="$1" -v b="$2" 'BEGIN {print (a > b ? a : b)}'; }
ll_pp_bf16=0 ll_tg_bf16=0 ll_pp_f32=0 ll_tg_f32=0 hpd_pp=0 hpd_tg=0 hpd16_pp=0 hpd16_tg=0
rounds=""
for ((r = 0; r < REPS; r++)); do
    read -r a b < <(ll "$WORK/$name-bf16.gguf")
    ll_pp_bf16=$(max "$ll_pp_bf16" "$a") ll_tg_bf16=$(max "$ll_tg_bf16" "$b")
    read -r c d < <(hpd cpu-bf16 "$r")
    hpd16_pp=$(max "$hpd16_pp" "$c") hpd16_tg=$(max "$hpd16_tg" "$d")
    rounds+=$(awk -v r="$r" -v a="$a" -v b="$b" -v c="$c" -v d="$d" 'BEGIN {
        printf "round %d: llama.cpp BF16 prefill %.1f decode %.1f, hybridpd cpu-bf16 prefill %.1f decode %.1f: ratio prefill %.2f, decode %.2f\n",
            r, a, b, c, d, c / a, d / b}')$'\n'
    read -r a b < <(ll "$WORK/$name-f32.gguf")
    ll_pp_f32=$(max "$ll_pp_f32" "$a") ll_tg_f32=$(max "$ll_tg_f32" "$b")
    read -r a b < <(hpd cpu "$r")
    hpd_pp=$(max "$hpd_pp" "$a") hpd_tg=$(max "$hpd_tg" "$b")
done
out=$(cat "$WORK/hpd-cpu.txt")
echo "(the first run of each device; the figures below are the best of $REPS)"
echo "$out"
grep -E "^device|^VDPBF16PS|prefill|decode batch|GEMM alone" "$WORK/hpd-cpu-bf16.txt"
echo
echo "model $model, $THREADS threads, prompt $PROMPT, $GEN generated tokens, best of $REPS rounds"
printf "%s" "$rounds"
printf "llama.cpp BF16: prefill %9.1f tok/s, decode %7.1f tok/s\n" "$ll_pp_bf16" "$ll_tg_bf16"
printf "llama.cpp F32:  prefill %9.1f tok/s, decode %7.1f tok/s\n" "$ll_pp_f32" "$ll_tg_f32"
printf "hybridpd BF16 weights, fp32 products (cpu):      prefill %9.1f tok/s, decode %7.1f tok/s\n" \
    "$hpd_pp" "$hpd_tg"
printf "hybridpd BF16 weights, bf16 products (cpu-bf16): prefill %9.1f tok/s, decode %7.1f tok/s\n" \
    "$hpd16_pp" "$hpd16_tg"
# the same matmul flops per prompt token for both engines (the same model):
# what llama.cpp's prefill asks of the cores, against their fp32 FMA peak
flops=$(echo "$out" | awk '/matmul flops per prompt token/ {print $(NF-1)}')
peak=$(echo "$out" | awk '/^fp32 FMA peak/ {print $7}')
"$PY" -c "import sys
pp, tg, p16, t16, lpb, ltb, lpf, ltf, fl, pk = map(float, sys.argv[1:])
print(f'ratio hybridpd cpu / llama.cpp BF16:      prefill {pp / lpb:.2f}, decode {tg / ltb:.2f}')
print(f'ratio hybridpd cpu-bf16 / llama.cpp BF16: prefill {p16 / lpb:.2f}, decode {t16 / ltb:.2f}')
print(f'ratio hybridpd cpu / llama.cpp F32:       prefill {pp / lpf:.2f}, decode {tg / ltf:.2f}')
print(f'prefill matmuls (fp32 FMA peak {pk:.1f} GFLOP/s): hybridpd cpu {pp * fl:.1f} GFLOP/s '
      f'({pp * fl / pk:.2f} of it), cpu-bf16 {p16 * fl:.1f} ({p16 * fl / pk:.2f}), llama.cpp BF16 '
      f'{lpb * fl:.1f} ({lpb * fl / pk:.2f}), llama.cpp F32 {lpf * fl:.1f} ({lpf * fl / pk:.2f})')" \
    "$hpd_pp" "$hpd_tg" "$hpd16_pp" "$hpd16_tg" "$ll_pp_bf16" "$ll_tg_bf16" "$ll_pp_f32" \
    "$ll_tg_f32" "$flops" "$peak"
