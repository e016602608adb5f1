#!/usr/bin/env bash
# Nsight Compute on the kernels whose speed issue 19 sets goals for, on a
# GPU machine, after scripts/gpu-check.sh has built build-gpu:
#
#   bash scripts/gpu-profile.sh [BUILD_DIR] [OUT_DIR]
#
# For each kernel, `ncu --clock-control none` (docs: leave the clocks alone)
# profiles two of hpd-bench-cuda's launches of it (after two skipped: warm
# caches) with the SpeedOfLight, Occupancy, LaunchStats and WarpStateStats
# sections, and OUT_DIR/summary.txt gets per kernel its duration, memory and
# compute throughput (% of peak), DRAM throughput, registers, achieved
# occupancy and the warp stall reasons (the raw CSV beside it). The steps
# share one deadline, GPU_PROFILE_SECONDS (default 300).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
b=${1:-build-gpu}
out=${2:-gpu-profile-out}
mkdir -p "$out"
summary=$out/summary.txt
deadline=$(($(date +%s) + ${GPU_PROFILE_SECONDS:-300}))
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
left() { echo $((deadline - $(date +%s))); }
# shellcheck disable=SC1091
[ -f .gpudeps/env.sh ] && source .gpudeps/env.sh
export HPD_CUDA_GRAPHS=${HPD_CUDA_GRAPHS:-1}
# shellcheck disable=SC2012
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -z "$ncu" ]; then
  say "gpu-profile: ncu not found"
  exit 1
fi
bench=("$b/bench/hpd-bench-cuda" --seqs 32 --context 4096 --prefill 4096 --reps 1 --copy-mib 64)
[ -x "${bench[0]}" ] || { say "gpu-profile: ${bench[0]} not built (run scripts/gpu-check.sh)"; exit 1; }
say "# gpu-profile $(date -u +%FT%TZ) ($ncu)"
# the kernels of the issue's goals: attention decode (fp32 and tensor
# cores), the decode GEMMs, the tensor-core tiled GEMM, GDN decode and the
# chunked rule's passes (cuda's, then cuda-bf16's on tensor cores)
kernels=(attention_split_kernel attention_split_tc_kernel gemv_ring_kernel gemv_kernel
         gemm_tc_kernel gdn_recurrent_kernel gdn_chunk_prep_kernel gdn_chunk_state_reg
         gdn_chunk_prep_tc_kernel gdn_chunk_state_tc_kernel)
metrics='Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Block Limit|Warp Cycles Per Issued Instruction|Stall'
for k in "${kernels[@]}"; do
  if [ "$(left)" -lt 30 ]; then
    say "== $k: not run (deadline)"
    continue
  fi
  t=$(left)
  [ "$t" -gt 120 ] && t=120
  timeout "$t" "$ncu" --clock-control none --kernel-name "regex:$k" --launch-skip 2 \
    --launch-count 2 --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --csv --page details "${bench[@]}" > "$out/$k.csv" 2> "$out/$k.err"
  r=$?
  say "== $k (rc $r)"
  # "Kernel Name","...","Section Name","Metric Name","Metric Unit","Metric Value"
  grep -E "\"($metrics)" "$out/$k.csv" |
    awk -F'","' '{ n = NF; printf "  %-60.60s %-40s %s %s\n", $5, $(n - 2), $n, $(n - 1) }' |
    sed 's/"$//' | tee -a "$summary" > /dev/null
  [ -s "$out/$k.csv" ] || tail -3 "$out/$k.err" | sed 's/^/  /' | tee -a "$summary" > /dev/null
done
say "summary: $summary"
