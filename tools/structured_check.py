#!/usr/bin/env python3
"""By hand: structured outputs through a running cluster with the official
openai client, every finished answer validated with `jsonschema`.

50 schemas are generated from a seed (nested objects with required and
optional properties, additionalProperties false / a schema / true, enums
and consts, arrays with minItems / maxItems, anyOf, $ref to $defs, string
patterns and lengths, numbers, integers, booleans, nulls), each sent as
response_format json_schema to chat completions with several sampling
seeds (a random model: the grammar alone makes the answers documents).
An answer that ends ("stop") must validate; one cut by max_tokens
("length") is a prefix and is only counted. Exit status 1 on any invalid
document. Tooling only (docs/structured_outputs.md).

  pip install openai jsonschema
  python3 tools/structured_check.py [BASE_URL] [KEY_FILE] [--schemas 50] [--seeds 4]
"""
import argparse
import json
import random
import sys

import jsonschema
from openai import OpenAI

WORDS = ["alpha", "beta", "gamma", "delta", "red", "green", "kilo", "zulu", "x", "y"]


def gen_schema(rng, depth=0, defs=None):
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const", "pattern"]
    if depth < 2:
        kinds += ["object", "object", "array", "anyOf"]
        if defs is not None:
            kinds.append("ref")
    k = rng.choice(kinds)
    if k == "string":
        s = {"type": "string", "maxLength": rng.randint(0, 12)}
        if rng.random() < 0.3:
            s["minLength"] = rng.randint(0, s["maxLength"])
        return s
    if k in ("integer", "number", "boolean", "null"):
        return {"type": k}
    if k == "enum":
        return {"enum": rng.sample(WORDS, rng.randint(1, 4)) + ([rng.randint(-5, 5)] if rng.random() < 0.5 else [])}
    if k == "const":
        return {"const": rng.choice([rng.choice(WORDS), rng.randint(0, 99), True, None, {"k": [1, "v"]}])}
    if k == "pattern":
        return {"type": "string", "pattern": rng.choice([
            "^[a-z]{2,6}$", "^\\d{3}-\\d{4}$", "^(yes|no|maybe)$", "^[A-Z][a-z]*( [A-Z][a-z]*)?$",
            "^[0-9a-f]{4}$", "^v\\d+\\.\\d+$"])}
    if k == "object":
        props = {}
        for name in rng.sample(WORDS, rng.randint(1, 4)):
            props[name] = gen_schema(rng, depth + 1, defs)
        s = {"type": "object", "properties": props,
             "required": [n for n in props if rng.random() < 0.6]}
        r = rng.random()
        s["additionalProperties"] = False if r < 0.6 else ({"type": "integer"} if r < 0.8 else True)
        return s
    if k == "array":
        lo = rng.randint(0, 2)
        return {"type": "array", "items": gen_schema(rng, depth + 1, defs), "minItems": lo,
                "maxItems": lo + rng.randint(0, 3)}
    if k == "anyOf":
        return {"anyOf": [gen_schema(rng, depth + 1, defs) for _ in range(rng.randint(2, 3))]}
    name = "d%d" % len(defs)
    defs[name] = gen_schema(rng, depth + 1, None)
    return {"$ref": "#/$defs/" + name}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base", nargs="?", default="http://127.0.0.1:17602/v1")
    ap.add_argument("key_file", nargs="?", default=".hpd/local/client-keys")
    ap.add_argument("--schemas", type=int, default=50)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    key = open(args.key_file).readline().split()[0]
    c = OpenAI(base_url=args.base, api_key=key)
    rng = random.Random(args.seed)
    stats = {"stop": 0, "length": 0, "invalid": 0}
    for i in range(args.schemas):
        defs = {}
        schema = gen_schema(rng, 0, defs)
        if schema.get("type") != "object":
            schema = {"type": "object", "properties": {"value": schema}, "required": ["value"],
                      "additionalProperties": False}
        if defs:
            schema["$defs"] = defs
        jsonschema.Draft202012Validator.check_schema(schema)
        for seed in range(args.seeds):
            r = c.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Answer in JSON."}],
                max_tokens=args.max_tokens, temperature=1.0, seed=seed,
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "s%d" % i, "schema": schema}},
                extra_body={"chat_template_kwargs": {"enable_thinking": False}})
            ch = r.choices[0]
            if ch.finish_reason != "stop":
                stats["length"] += 1
                continue
            try:
                doc = json.loads(ch.message.content)
                jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
                stats["stop"] += 1
            except Exception as e:  # noqa: BLE001 (any failure is a finding)
                stats["invalid"] += 1
                print(f"schema {i} seed {seed}: INVALID {ch.message.content!r}: {e}\n"
                      f"  schema {json.dumps(schema)}")
    total = args.schemas * args.seeds
    print(f"{args.schemas} schemas x {args.seeds} seeds: {stats['stop']} of {total} answers "
          f"ended and validate, {stats['length']} cut at max_tokens {args.max_tokens}, "
          f"{stats['invalid']} invalid")
    sys.exit(1 if stats["invalid"] else 0)


if __name__ == "__main__":
    main()
