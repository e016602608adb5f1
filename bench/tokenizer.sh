#!/usr/bin/env bash
# Tokenizer encode MB/s on one thread: hybridpd's C tokenizer against
# Hugging Face tokenizers (Rust, through its Python binding, the encode call
# alone timed) on the same tokenizer.json and the same text: the test
# corpus (tests/tokenizer/expected.json) repeated to ~4 MB.
#   bash bench/tokenizer.sh [TOKENIZER_JSON]    PYTHON: a Python with tokenizers
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh > /dev/null
tok=${1:-tests/tokenizer/qwen3_5.tokenizer.json}
PY=${PYTHON:-python3}
text=$(mktemp /tmp/hpd-bench-tok-XXXXXX)
trap 'rm -f "$text"' EXIT
"$PY" - "$text" <<'PYEOF'
import json, sys
cases = json.load(open("tests/tokenizer/expected.json"))["tokenizers"]["qwen2"]["cases"]
texts = [c["text"] for c in cases if "text" in c]
blob = "\n".join(texts)
with open(sys.argv[1], "w", encoding="utf-8") as f:
    f.write((blob + "\n") * (4_000_000 // len(blob.encode()) + 1))
PYEOF
./build/bench/hpd-bench-tokenizer "$tok" "$text" 3 | tee /tmp/hpd-bench-tok.out
TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 "$PY" - "$tok" "$text" <<'PYEOF'
import sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
data = open(sys.argv[2], "rb").read()
text = data.decode("utf-8")
best = 1e30
for _ in range(3):
    t0 = time.perf_counter()
    ids = tok.encode(text).ids
    best = min(best, time.perf_counter() - t0)
print(f"tokenizers: {len(data)} bytes -> {len(ids)} ids in {best:.3f} s: {len(data) / best / 1e6:.2f} MB/s")
with open("/tmp/hpd-bench-tok.out") as f:
    ours = float(f.read().split()[-2])
print(f"ratio hybridpd / tokenizers: {ours / (len(data) / best / 1e6):.2f}")
PYEOF
