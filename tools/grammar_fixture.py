#!/usr/bin/env python3
"""Writes tests/grammar/corpus.json: JSON Schemas with documents, each
document judged by llguidance (PyPI), and at every token position of some
of them the set of tokens llguidance allows next over the test tokenizer
(tests/tokenizer/qwen3_5.tokenizer.json). test_grammar (ctest) requires the
C matcher to judge every document alike and to allow the same tokens.

Each case is compiled in both layouts: llguidance's flexible whitespace
("," and ":" with any JSON whitespace inside the document), and none but
json.dumps' separators (", " and ": "; hybridpd's default).

Run by hand (never in CI):

    python3 -m venv /tmp/genv && /tmp/genv/bin/pip install llguidance tokenizers
    /tmp/genv/bin/python tools/grammar_fixture.py --out tests/grammar/corpus.json
"""
import argparse
import json
import os

import llguidance

S = {"type": "string"}
I = {"type": "integer"}
N = {"type": "number"}

# (schema, documents): the documents both valid and not
CASES = [
    (S, ['"abc"', '""', '"a\\"b"', '"a\\\\b"', '"\\n\\t\\r\\b\\f"', '"\\u0041"', '"\\/"', '"é漢😀"',
         '"a\x01"', '"a\x7f"', '"\u2028"', '"\t"', '"abc', 'abc', '"a"b', '"\xc3"',
         '"\\u0001"', '"\\u001F"', '"\\u007f"', '"\\u0020"', '"\\u0080"']),
    (I, ['0', '-0', '12', '-12', '01', '1.0', '1e5', '-', '123456789012345678901234567890']),
    (N, ['0', '-0.5', '1.', '.5', '1e5', '1E+5', '-0.5e-3', '00', '1.5e', '2.25']),
    ({"type": "boolean"}, ['true', 'false', 'tru', 'null', 'truee']),
    ({"type": "null"}, ['null', 'nul', 'true']),
    ({"type": ["string", "null"]}, ['null', '"x"', '1']),
    ({"type": "object", "properties": {"a": S, "b": I}},
     ['{"a": "x", "b": 1}', '{"a":"x","b":1}', '{"b": 1}', '{}', '{"b": 1, "a": "x"}',
      '{"a": "x", "c": 1}', '{"a": "x", "a": "y"}', '{ "a" : "x" }', '{"a": "x"} ']),
    ({"type": "object", "properties": {"a": S, "b": I}, "required": ["b"],
      "additionalProperties": False},
     ['{"a": "x", "b": 1}', '{"b": 1}', '{"a": "x"}', '{}', '{"b": 1, "c": 2}']),
    ({"type": "object", "additionalProperties": I},
     ['{"a": 1, "b": 2}', '{"a": "x"}', '{}', '{"": 0}']),
    ({"type": "object", "properties": {"a": S}, "additionalProperties": I},
     ['{"a": "s", "b": 2}', '{"ab": 2}', '{"a": 2}', '{"b": 2, "a": "s"}', '{"\\u00e9": 1}',
      '{"\\u0061": 1}', '{"\\ud83d\\ude00": 1}', '{"\\ud83d": 1}', '{"\\udc00": 1}', '{"\\/": 1}']),
    ({"type": "string", "pattern": "^\\s\\S\\d\\w.$"}, ['"\u3000x1_\r"', '"\ufeffx1_a"', '"\u00a0é1_a"',
                                                       '" x1_\\n"']),
    ({"type": "string", "pattern": "^[à-ÿ]+[^a-z]$"}, ['"àé1"', '"aé1"', '"ééa"']),
    ({"type": "array", "items": I, "minItems": 1, "maxItems": 3},
     ['[1]', '[1, 2, 3]', '[1,2]', '[]', '[1, 2, 3, 4]', '["a"]']),
    ({"type": "array"}, ['[1, "a", [], {}]', '[]', '[1, ]']),
    ({"enum": ["red", "green", 1, None, {"x": [1, 2]}]},
     ['"red"', '"green"', '"blue"', '1', 'null', '{"x": [1, 2]}', '{"x":[1,2]}', '"re"']),
    ({"const": "a\"b"}, ['"a\\"b"', '"a"']),
    ({"type": "string", "minLength": 2, "maxLength": 3},
     ['"ab"', '"abc"', '"a"', '"abcd"', '"é!"', '"\\n\\n"']),
    ({"type": "string", "pattern": "^[a-z]+[0-9]{2,3}$"},
     ['"ab12"', '"a123"', '"a1"', '"a1234"', '"12"']),
    ({"type": "string", "pattern": "a+b"}, ['"xaab"', '"ab"', '"ba"', '"xxabyy"']),
    ({"type": "string", "pattern": "^(\\d{3}-)?\\d{4}$"}, ['"123-4567"', '"4567"', '"12-4567"']),
    ({"type": "string", "pattern": "^[^@\\s]+@[^@\\s]+\\.\\w+$"},
     ['"a@b.co"', '"é@x.org"', '"a b@c.d"', '"a@b"']),
    ({"type": "string", "pattern": "^.{2}$"}, ['"ab"', '"éé"', '"a"', '"a\\nb"']),
    ({"anyOf": [{"type": "object", "properties": {"a": S}, "required": ["a"]},
                {"type": "object", "properties": {"b": I}, "required": ["b"]}]},
     ['{"a": "x"}', '{"b": 1}', '{"c": 1}', '{}']),
    ({"anyOf": [S, I, {"type": "array", "items": S}]}, ['"x"', '5', '["a", "b"]', '[1]']),
    ({"$defs": {"node": {"type": "object", "properties": {"v": I, "next": {"$ref": "#/$defs/node"}},
                         "required": ["v"], "additionalProperties": False}},
      "$ref": "#/$defs/node"},
     ['{"v": 1}', '{"v": 1, "next": {"v": 2}}', '{"v": 1, "next": {}}', '{"next": {"v": 1}}']),
    ({"type": "object",
      "properties": {"name": S, "age": I, "tags": {"type": "array", "items": S, "maxItems": 2},
                     "address": {"type": "object",
                                 "properties": {"city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                                 "required": ["city"], "additionalProperties": False},
                     "kind": {"enum": ["a", "b"]}},
      "required": ["name", "age"], "additionalProperties": False},
     ['{"name": "Ann", "age": 30}',
      '{"name": "Ann", "age": 30, "tags": ["x", "y"], "address": {"city": "Paris", "zip": "75001"}, "kind": "b"}',
      '{"name": "Ann", "age": 30, "tags": ["x", "y", "z"]}',
      '{"name": "Ann", "age": 30, "address": {"zip": "75001"}}',
      '{"name": "Ann", "age": "30"}']),
    ({"description": "any value"}, ['{"a": [1, {"b": null}]}', '"x"', '1', '[true, false]']),
    ({}, ['{"a": 1}', 'nul']),
]

# cases whose documents' token masks are recorded: (case index, document index)
MASKED = [(0, 0), (0, 7), (0, 16), (2, 9), (6, 0), (7, 0), (9, 0), (9, 4), (9, 6), (10, 0),
          (11, 0), (12, 1), (14, 0), (16, 4), (17, 0), (22, 1), (24, 1), (25, 1), (26, 0)]

FORMATS = {
    "flexible": {"whitespace_flexible": True},
    "compact": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
}


def judge(tok, grammar, ids):
    m = llguidance.LLMatcher(tok, grammar)
    n = m.try_consume_tokens(ids)
    ok = n == len(ids) and not m.is_error()
    return ok, ok and m.is_accepting()


def mask_hex(m, n_vocab):
    bits = m.compute_bitmask()
    out = bytearray(bits)[: (n_vocab + 31) // 32 * 4]
    return out.hex()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                         "tokenizer", "qwen3_5.tokenizer.json"))
    args = ap.parse_args()
    from tokenizers import Tokenizer
    text = open(args.tokenizer).read()
    hf = Tokenizer.from_str(text)
    eos = hf.token_to_id("<|im_end|>")
    n_vocab = hf.get_vocab_size(with_added_tokens=True)
    tok = llguidance.LLTokenizer(text, n_vocab=n_vocab, eos_token=eos)
    cases = []
    for ci, (schema, docs) in enumerate(CASES):
        for fname, opts in FORMATS.items():
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=opts)
            entry = {"schema": schema, "format": fname, "docs": []}
            for di, doc in enumerate(docs):
                ids = hf.encode(doc, add_special_tokens=False).ids
                if hf.decode(ids, skip_special_tokens=False) != doc:
                    # the tokenizer cannot spell it: judge it byte by byte
                    ids = [t for ch in doc.encode() for t in [hf.token_to_id(bytes([ch]).decode("latin-1"))] if t is not None]
                ok, whole = judge(tok, grammar, ids)
                d = {"doc": doc, "valid": ok, "whole": whole}
                if (ci, di) in MASKED and ok:
                    m = llguidance.LLMatcher(tok, grammar)
                    d["ids"] = ids
                    d["masks"] = []
                    for t in ids:
                        d["masks"].append(mask_hex(m, n_vocab))
                        if not m.consume_token(t):
                            break
                    else:
                        d["masks"].append(mask_hex(m, n_vocab))
                entry["docs"].append(d)
            cases.append(entry)
    out = {"tokenizer": "tests/tokenizer/qwen3_5.tokenizer.json", "eos": eos, "n_vocab": n_vocab,
           "llguidance": llguidance.__version__ if hasattr(llguidance, "__version__") else "",
           "cases": cases}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
