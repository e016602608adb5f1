#!/bin/bash
# Downloads flash-linear-attention's wheels (and einops) into .fla-wheels for
# bench/cuda.sh on a GPU machine without a package registry: carry
# .fla-wheels there. torch and Triton are expected on that machine already.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download --no-deps -d .fla-wheels "flash-linear-attention==${FLA_VERSION:-0.6.0}" \
  "fla-core==${FLA_VERSION:-0.6.0}" einops
ls -l .fla-wheels
