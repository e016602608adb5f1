#!/usr/bin/env bash
# TTFT through the HTTP API (docs/api.md) against the msgpack client, on one
# local cluster and the same prompts, then TPOT and TTFT with a JSON Schema
# against without (docs/structured_outputs.md), and of chats whose answer
# must be a tool call against the same chats free (bench/hpd-bench-http.c):
#   bash bench/http.sh [MODEL_DIR] [hpd-bench-http options]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh > /dev/null
model=${1:-models/tiny}
shift || true
[ -f "$model/config.json" ] || ./build/tools/hpd-mkmodel --out "$model" --seed 1 > /dev/null
./build/bench/hpd-bench-http --model "$model" "$@"
