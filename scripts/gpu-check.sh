#!/usr/bin/env bash
# The GPU check (issue 19), for a machine with a GPU, run from a fresh copy
# of the tree that carries .gpudeps (DEVELOPERS.md) and, for the side by
# side with flash-linear-attention, .fla-wheels (tools/fetch-fla-wheels.sh):
#
#   bash scripts/gpu-check.sh [OUT_DIR]
#
# 1. builds into build-gpu (Release, -lineinfo, sm_90);
# 2. runs every ctest test labelled gpu with HPD_REQUIRE_GPU=1 (a skip is a
#    failure), and reruns the failed ones with HPD_CUDA_SYNC=1 (synchronise
#    and check after every op, so that an error names its op);
# 3. runs bench/cuda.sh;
# 4. runs compute-sanitizer's memcheck, racecheck, synccheck and initcheck
#    over the GPU parity tests, the benchmark's kernels at small sizes and a
#    short generation, as long as the deadline allows;
# and writes OUT_DIR/summary.txt with every result and figure (the logs of
# each step beside it). The steps share one deadline, GPU_CHECK_SECONDS
# (default 540: one 10-minute device call with room to copy back), and a
# step that would pass it is cut short and says so.
set -uo pipefail
cd "$(dirname "$0")/.."
# decode steps recorded as CUDA graphs (the default; said here so that an
# HPD_CUDA_GRAPHS=0 left in the environment does not turn them off) in
# every test, the benchmark and the sanitizers' generation
export HPD_CUDA_GRAPHS=${HPD_CUDA_GRAPHS:-1}
out=${1:-${OUT:-gpu-check-out}}
mkdir -p "$out"
summary=$out/summary.txt
start=$(date +%s)
deadline=$((start + ${GPU_CHECK_SECONDS:-540}))
jobs=$(nproc)
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
left() { echo $((deadline - $(date +%s))); }
# step_timeout CAP: the seconds a step may take, CAP at most
step_timeout() { local l; l=$(left); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }

say "# gpu-check $(date -u +%FT%TZ)"
if [ -f .gpudeps/env.sh ]; then
  # shellcheck disable=SC1091
  source .gpudeps/env.sh
else
  say "no .gpudeps/env.sh: the system's libraries are used"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader \
  2>&1 | sed 's/^/gpu: /' | tee -a "$summary"
say "nvcc: $(nvcc --version 2>&1 | grep -o 'release [0-9.]*' || echo none)"

# NCCL: the toolkit's, else the one PyTorch's wheels bring
nccl_root=
if ! ls /usr/local/cuda/lib64/libnccl.so* > /dev/null 2>&1; then
  nccl_root=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)
  if [ -n "$nccl_root" ]; then
    export LD_LIBRARY_PATH=$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    say "nccl: $nccl_root (PyTorch's wheel)"
  fi
fi

# 1. build
b=build-gpu
t0=$(date +%s)
if ! timeout "$(step_timeout 240)" cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      ${nccl_root:+-DHPD_NCCL_ROOT=$nccl_root} \
      > "$out/build.log" 2>&1 ||
   ! timeout "$(step_timeout 240)" cmake --build "$b" -j"$jobs" >> "$out/build.log" 2>&1; then
  say "build: FAILED after $(( $(date +%s) - t0 )) s (build.log)"
  grep -E "error|Error" "$out/build.log" | head -20 | tee -a "$summary"
  exit 1
fi
grep -q "CUDA backend and NCCL transport on" "$out/build.log" ||
  { say "build: no CUDA backend (build.log)"; exit 1; }
say "build: ok in $(( $(date +%s) - t0 )) s"

# 2. the gpu tests, a skip counted as a failure; tests of two GPUs are left
#    out on a machine with one, and the summary says so
t0=$(date +%s)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
exclude=()
if [ "$gpus" -lt 2 ]; then
  exclude=(-E test_xfer_nccl)
  say "gpu tests: test_xfer_nccl not run (it needs 2 GPUs, this machine has $gpus)"
fi
(cd "$b" && HPD_REQUIRE_GPU=1 timeout "$(step_timeout 200)" ctest -L gpu "${exclude[@]}" -j4 \
   --timeout 180 --output-on-failure) > "$out/tests.log" 2>&1
rc=$?
say "gpu tests: rc $rc in $(( $(date +%s) - t0 )) s"
grep -E "Test +#|tests passed|Not Run|Skipped" "$out/tests.log" | sed 's/^/  /' | tee -a "$summary"
if [ "$rc" -ne 0 ] && [ "$(left)" -gt 60 ]; then
  (cd "$b" && HPD_REQUIRE_GPU=1 HPD_CUDA_SYNC=1 timeout "$(step_timeout 90)" ctest --rerun-failed \
     --timeout 80 --output-on-failure) > "$out/tests-sync.log" 2>&1
  say "failed tests again with HPD_CUDA_SYNC=1: rc $? (tests-sync.log)"
  grep -E "cuda|FAILED|Test +#" "$out/tests-sync.log" | head -30 | sed 's/^/  /' | tee -a "$summary"
fi

# 3. the benchmarks
if [ "$(left)" -gt 90 ]; then
  timeout "$(step_timeout 200)" bash bench/cuda.sh "$b" > "$out/bench.log" 2>&1
  say "bench/cuda.sh: rc $?"
  grep -vE "^==|^\s*$" "$out/bench.log" | sed 's/^/  /' | tee -a "$summary" > /dev/null
else
  say "bench/cuda.sh: not run (deadline)"
fi
# 4. compute-sanitizer at small sizes: the parity tests, the benchmark's
#    kernels and a generation whose 70-token prompt crosses a GDN chunk
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
model=$out/tiny-model
"$b/tools/hpd-mkmodel" --out "$model" --hidden 64 --layers 4 --full-interval 2 > /dev/null 2>&1
ids=$(seq -s, 1 70)
gen="$b/tools/hpd-run --model $model --device cuda --prompt-ids $ids --max-tokens 4"
one=$(mktemp)
for tool in memcheck racecheck synccheck initcheck; do
  [ -n "$san" ] || { say "sanitizer: compute-sanitizer not found"; break; }
  cmds=("$b/tests/test_backend_cuda"
        "$b/bench/hpd-bench-cuda --seqs 2 --context 96 --prefill 130 --reps 1 --copy-mib 4"
        "$gen")
  # racecheck, the slowest, takes the generation and the GPU test's cases
  # with shared memory between warps one by one: the GEMV's row groups, the
  # chunked rule's state passes, the split attention (fp32 and tensor
  # cores), the tensor-core GEMM's tiles, the sampler's histograms and sort,
  # the MoE routing's warps and scans, the grouped GEMM's plan (the quick
  # cases first: the slowest, the GEMV's batches, last)
  [ "$tool" = racecheck ] && cmds=(
        "HPD_TEST_ONLY=test_moe_route $b/tests/test_backend_cuda"
        "HPD_TEST_ONLY=test_bf16_attention $b/tests/test_backend_cuda"
        "HPD_TEST_ONLY=test_fast_gemm_tensor_cores $b/tests/test_backend_cuda"
        "HPD_TEST_ONLY=test_sample $b/tests/test_backend_cuda"
        "HPD_TEST_ONLY=test_kv_store_and_attention $b/tests/test_backend_cuda"
        "HPD_TEST_ONLY=test_gdn_chunked $b/tests/test_backend_cuda"
        "HPD_TEST_ONLY=test_bf16_gdn_chunked $b/tests/test_backend_cuda"
        "HPD_TEST_ONLY=test_gemm_grouped $b/tests/test_backend_cuda"
        "$gen"
        "HPD_TEST_ONLY=test_gemm_batch_invariance $b/tests/test_backend_cuda")
  for cmd in "${cmds[@]}"; do
    label=$cmd
    only=() # a leading HPD_TEST_ONLY=... goes into the environment
    case $cmd in HPD_TEST_ONLY=*) only=("${cmd%% *}"); cmd=${cmd#* } ;; esac
    [ "$(left)" -gt 60 ] || { say "sanitizer $tool: not run (deadline) :: ${label%% /*}"; continue; }
    # shellcheck disable=SC2086
    # API errors are not reported: test_host_register provokes CUDA's
    # "already registered" on purpose, and the tests check every API result
    env "${only[@]}" timeout "$(step_timeout 90)" "$san" --tool "$tool" --print-limit 10 \
      --report-api-errors no --error-exitcode 99 $cmd > "$one" 2>&1
    r=$?
    { echo "=== $tool: $label (rc $r)"; cat "$one"; } >> "$out/sanitizer.log"
    sum=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$one" | tail -1)
    [ "$r" -eq 124 ] && sum="cut at the deadline"
    say "sanitizer $tool: rc $r ${sum:-no summary} :: ${only[*]} ${cmd%% *}"
  done
done
rm -f "$one"

say "total: $(( $(date +%s) - start )) s"
