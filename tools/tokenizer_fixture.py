#!/usr/bin/env python3
"""Writes the tokenizer test fixtures under tests/tokenizer/: two byte-level
BPE tokenizer.json files trained with Hugging Face `tokenizers` (Qwen2's /
Qwen3-Next's pre-tokenizer regex, and Qwen3.5's, which adds \\p{M}), both
with the NFC normalizer, the ByteLevel decoder and Qwen's special tokens;
and expected.json: for every case of the corpus (several languages and
scripts, emoji and ZWJ sequences, combining marks, code, runs of whitespace,
numbers, special tokens inside text, invalid UTF-8, NUL bytes), the ids `tokenizers`
gives. test_tokenizer (ctest) requires the C tokenizer to give the same.

Run by hand (never in CI); needs `tokenizers` from PyPI:

    /tmp/hfenv/bin/python tools/tokenizer_fixture.py --out tests/tokenizer

Invalid UTF-8 cannot reach `tokenizers` (it takes str); the C tokenizer
replaces each invalid sequence with U+FFFD first, as Python's
bytes.decode(errors="replace") does, and the expected ids are those of that
decoded text.
"""
import argparse
import json
import os

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
         r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}"
          r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

CASES = [
    "Hello, world! This is a test of the tokenizer.",
    "It's the tokenizer's job: they'll, we've, I'm, you'd, she's, DON'T SHOUT.",
    "Numbers: 12345 67890 3.14159 -42 1,000,000 2026-11-26",
    "Grüße aus München! Ärger, Öl, Übermut, ß.",
    "Le café était très bon, n'est-ce pas ? Où est la fenêtre ?",
    "Привет, мир! Как дела? Съешь же ещё этих мягких французских булок.",
    "你好，世界！今天天气很好。我们一起去公园散步吧。",
    "こんにちは、世界。カタカナとひらがなと漢字が混ざっています。",
    "안녕하세요 세계! 한국어 문장입니다.",
    "مرحبا بالعالم! هذه جملة باللغة العربية.",
    "नमस्ते दुनिया! यह हिन्दी का वाक्य है। क्षत्रिय",
    "Emoji: 😀 😃 👍🏽 👨\u200d👩\u200d👧\u200d👦 🏳️\u200d🌈 ❤️ 🇩🇪🇯🇵",
    "Combining marks: e\u0301 a\u0308 n\u0303 o\u0302\u0323 Z\u0351\u0352\u0353 (NFC composes some)",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "int main(void) { printf(\"%d\\n\", 42); return 0; }",
    "Tabs\tand   spaces    and\n\n\nnewlines\r\n and trailing   ",
    "   leading spaces",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>",
    "special inside<|endoftext|>text and <|im_end|> again<|im_end|><|im_end|>",
    "Mixed: naïve façade coöperate Ελληνικά עברית ไทย Tiếng Việt",
    "URLs: https://example.com/path?q=1&r=2#frag and emails a.b@c.de",
    "Punctuation!!! ??? ... --- ((( ))) [[ ]] {{ }} <<>> @@@ ### $$$ %%%",
    "",
    " ",
    "\n",
    "a",
    "😀",
    "\u00c5ngstr\u00f6m vs A\u030angstro\u0308m",
    "<think>\nhmm\n</think>\n\nanswer",
]
# long pre-tokens (the C tokenizer merges those through a heap): one word of
# 3000 letters, a long base64-like run, a long compound, a run of spaces, a
# long CJK run; not in TRAIN (the trained vocabulary stays as it was)
LONG = [
    "a" * 3000,
    "ab" * 700 + " " + "xyz" * 200,
    "QmFzZTY0IGVuY29kZWQgdGV4dCBpcyBsb25nIGFuZCBoYXMgbm8gc3BhY2VzIGF0IGFsbA" * 8,
    "Donaudampfschifffahrtselektrizitätenhauptbetriebswerkbauunterbeamtengesellschaft" * 3,
    " " * 500 + "x",
    "日本語の文章" * 60,
]
# and words of random common letters, whose merges overlap and reorder (a
# pair taken from the heap after its symbols changed must not merge early)
_rng = __import__("random").Random(7)
LONG += ["".join(_rng.choice("etaoinshrdlu") for _ in range(_rng.randint(60, 400)))
         for _ in range(24)]
# invalid UTF-8, as hex: a lone continuation byte, a truncated sequence, an
# overlong encoding, a surrogate, bytes never valid
INVALID = ["61ff62", "e282", "48c0af49", "eda080", "f0288cbc", "e6a0e6", "80bfc2"]
# valid text with NUL bytes (U+0000, a character like any other), as hex
WITH_NUL = ["610062000063", "0000", "e4bda000e5a5bd0a00"]

TRAIN = CASES * 3 + [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor. " * 3,
    "for (int i = 0; i < n; i++) { sum += a[i] * b[i]; }\n" * 3,
    "日本語の文章を少し書きます。東京は大きな都市です。" * 3,
    "Съешь же ещё этих мягких французских булок, да выпей чаю. " * 3,
]


def build(pattern, vocab_size):
    tok = Tokenizer(models.BPE(ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(TRAIN, trainer)
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/tokenizer")
    args = ap.parse_args()
    import tokenizers

    os.makedirs(args.out, exist_ok=True)
    result = {"made_by": {"tool": "tools/tokenizer_fixture.py",
                          "tokenizers": tokenizers.__version__},
              "tokenizers": {}}
    for name, pattern, size in (("qwen2", QWEN2, 1200), ("qwen3_5", QWEN35, 1500)):
        tok = build(pattern, size)
        path = os.path.join(args.out, f"{name}.tokenizer.json")
        tok.save(path)
        cases = []
        for text in CASES + LONG:
            cases.append({"text": text, "ids": tok.encode(text).ids})
        for hx in INVALID:
            text = bytes.fromhex(hx).decode("utf-8", errors="replace")
            cases.append({"hex": hx, "ids": tok.encode(text).ids})
        for hx in WITH_NUL:
            text = bytes.fromhex(hx).decode("utf-8")
            cases.append({"hex": hx, "valid": True, "ids": tok.encode(text).ids})
        result["tokenizers"][name] = {"file": os.path.basename(path), "cases": cases}
    with open(os.path.join(args.out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
