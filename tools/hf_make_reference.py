#!/usr/bin/env python3
"""Writes tests/model/hf_reference.json: what Hugging Face transformers computes
on small random models that hpd-mkmodel regenerates from a seed.

test_hf_reference (ctest) regenerates each model from the recorded arguments
and checks that the CPU engine gives the same greedy tokens and, within a
tolerance, the same logits at the last step. It is the one end-to-end check
in CI whose expectations do not come from this project's own engine.

Run by hand (never in CI); needs CPU torch and transformers from PyPI:

    python3 -m venv /tmp/hfenv
    /tmp/hfenv/bin/pip install torch transformers safetensors
    cmake --build build -j1 --target hpd-mkmodel
    /tmp/hfenv/bin/python tools/hf_make_reference.py --mkmodel build/tools/hpd-mkmodel \\
        --out tests/model/hf_reference.json

PyPI's torch for Linux brings CUDA libraries (a few GB) and runs on the CPU
all the same; the file records the versions that made it. Regenerate it
whenever hpd-mkmodel's random streams change: the test then fails on the
recorded weight sums before anything else.

Each case is a model (family, tensor naming, dtype on disk, tying) and each
prompt is a random token sequence; the lengths cross the 64-token chunk grid
of the gated delta rule. HF runs a full forward pass per generated token
(use_cache=False), so its chunked gated delta rule sees the whole sequence
every step, and the engine's prefill + recurrent decode is compared with it.
A prompt whose greedy steps are not all decided by a margin of at least
--min-margin between the top two logits is replaced by another one (next
prompt seed), so fp32 rounding differences cannot flip a token in the test.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

# transformers would otherwise look for hub kernels (no network in CI or here)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

# a small hybrid model: every third layer is full attention, so the 6 layers
# hold 4 Gated DeltaNet layers and 2 full attention layers
BASE = ("--hidden 128 --layers 6 --full-interval 3 --intermediate 256 --vocab 384 "
        "--heads 4 --kv-heads 2 --head-dim 32 --lin-k-heads 2 --lin-v-heads 4 "
        "--lin-k-dim 32 --lin-v-dim 48")

# name, extra hpd-mkmodel arguments, seed
CASES = [
    ("next-f32", "--arch qwen3_next --dtype f32", 101),
    ("next-bf16-tied", "--arch qwen3_next --dtype bf16 --tie --interval-only "
     "--rope-theta 10000", 102),
    ("q35text-f32", "--arch qwen3_5_text --dtype f32 --partial-rotary 0.5", 103),
    ("q35text-f16-tied", "--arch qwen3_5_text --dtype f16 --tie --rope-theta 10000", 104),
    ("q35-bf16-shards", "--arch qwen3_5 --dtype bf16 --shards 3", 105),
    # mixtures of experts: Qwen3-Next with a dense layer among sparse ones and
    # per-expert tensors; without renormalised top-k on a sparse step of 2;
    # Qwen3.5-MoE with fused 3-D expert tensors
    ("next-moe-bf16", "--arch qwen3_next --dtype bf16 --experts 8 --experts-per-tok 2 "
     "--moe-intermediate 48 --shared-intermediate 32 --mlp-only-layers 2", 106),
    ("next-moe-nonorm-f32", "--arch qwen3_next --dtype f32 --experts 6 --experts-per-tok 3 "
     "--moe-intermediate 40 --shared-intermediate 24 --no-norm-topk --sparse-step 2", 107),
    ("q35moe-bf16-fused", "--arch qwen3_5_moe --dtype bf16 --experts 8 --experts-per-tok 2 "
     "--moe-intermediate 48 --shared-intermediate 32 --fused-experts --shards 2", 108),
    # FP8 releases: block-quantised projections (32x32 blocks here, so that the
    # small matrices hold several), dequantised by transformers at load. The
    # projections' sizes are multiples of the block, as in the releases:
    # transformers' dequantiser takes the block from the scale grid (a 48-row
    # weight with 2 scale rows gets 24-row blocks), the engine from
    # weight_block_size
    ("next-fp8", "--arch qwen3_next --dtype bf16 --fp8 32", 109),
    ("q35moe-fp8", "--arch qwen3_5_moe --dtype bf16 --experts 8 --experts-per-tok 2 "
     "--moe-intermediate 64 --shared-intermediate 32 --fp8 32", 110),
]

PROMPT_LENS = [5, 70, 150]


def mkmodel(exe, out_dir, args):
    cmd = [exe, "--out", out_dir] + args.split()
    subprocess.run(cmd, check=True)


def load_hf(model_dir):
    """The model in fp32, with the class its config.json names."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    if cfg.model_type in ("qwen3_5", "qwen3_5_moe"):
        from transformers import Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration

        # the vision tower is unused by text prompts and absent from the file;
        # shrink it so its random init costs nothing
        v = cfg.vision_config
        v.depth, v.hidden_size, v.intermediate_size, v.num_heads = 1, 32, 64, 2
        v.out_hidden_size = cfg.text_config.hidden_size
        cls = (Qwen3_5MoeForConditionalGeneration if cfg.model_type == "qwen3_5_moe"
               else Qwen3_5ForConditionalGeneration)
        model = cls.from_pretrained(model_dir, config=cfg, dtype=torch.float32)
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval()


def weight_sums(model_dir):
    """Sum and sum of squares (float64) of every tensor in the files, upcast to
    fp32: invariant to the engine's fused layouts, so the test can tell a
    changed generator from a changed engine."""
    from safetensors import safe_open

    s = sq = 0.0
    n = 0
    with open(os.path.join(model_dir, "config.json")) as f:
        q = json.load(f).get("quantization_config")
    block = q["weight_block_size"] if q else None
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                if key.endswith("_scale_inv"):
                    continue  # folded into its weight below
                t = f.get_tensor(key)
                if t.dtype == torch.float8_e4m3fn:
                    # dequantised in fp32, as transformers and the engine do
                    sc = f.get_tensor(key + "_scale_inv").to(torch.float32)
                    t = t.to(torch.float32)
                    sc = sc.repeat_interleave(block[0], -2)[..., :t.shape[-2], :]
                    sc = sc.repeat_interleave(block[1], -1)[..., :t.shape[-1]]
                    t = t * sc
                t = t.to(torch.float32).to(torch.float64)
                s += float(t.sum())
                sq += float((t * t).sum())
                n += t.numel()
    return s, sq, n


def hf_greedy(model, prompt, n_new):
    """Greedy tokens with a full forward pass per step, the top-1/top-2 margin
    of every step and the logits of the last step."""
    ids = torch.tensor([prompt])
    tokens, margins = [], []
    last = None
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(input_ids=ids, use_cache=False).logits[0, -1].float()
            top = torch.topk(logits, 2)
            tokens.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))
            last = logits
            ids = torch.cat([ids, top.indices[:1].view(1, 1)], dim=1)
    return tokens, margins, last


def g9(x):
    """A float rounded to 9 significant digits (enough to round-trip fp32)."""
    return float(f"{x:.9g}")


def make_case(args, name, extra, seed, tmp):
    model_args = f"{BASE} {extra} --seed {seed}"
    model_dir = os.path.join(tmp, name)
    mkmodel(args.mkmodel, model_dir, model_args)
    model = load_hf(model_dir)
    vocab = model.config.get_text_config().vocab_size
    s, sq, n = weight_sums(model_dir)
    prompts = []
    for length in PROMPT_LENS:
        for attempt in range(args.max_attempts):
            g = torch.Generator().manual_seed(seed * 1000 + length * 10 + attempt)
            prompt = torch.randint(0, vocab, (length,), generator=g).tolist()
            tokens, margins, last = hf_greedy(model, prompt, args.new_tokens)
            if min(margins) >= args.min_margin:
                break
            print(f"{name}: prompt of {length} (attempt {attempt}) has a greedy margin "
                  f"{min(margins):.2e} < {args.min_margin}: drawing another", file=sys.stderr)
        else:
            sys.exit(f"{name}: no prompt of {length} tokens with margins >= {args.min_margin}")
        prompts.append({
            "prompt": prompt,
            "tokens": tokens,
            "margins": [g9(m) for m in margins],
            "last_logits": [g9(x) for x in last.tolist()],
        })
        print(f"{name}: prompt {length}: tokens {tokens}, min margin {min(margins):.3f}",
              file=sys.stderr)
    return {
        "name": name,
        "mkmodel_args": model_args,
        "seed": seed,
        "hf_class": type(model).__name__,
        "weights": {"count": n, "sum": s, "sum_sq": sq},
        "prompts": prompts,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mkmodel", default="build/tools/hpd-mkmodel")
    ap.add_argument("--out", default="tests/model/hf_reference.json")
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--min-margin", type=float, default=0.02,
                    help="smallest top-1/top-2 logit gap allowed at a greedy step")
    ap.add_argument("--max-attempts", type=int, default=20)
    args = ap.parse_args()

    import transformers

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="hpd-hfref-") as tmp:
        cases = [make_case(args, *c, tmp) for c in CASES]
    ref = {
        "made_by": {
            "tool": "tools/hf_make_reference.py",
            "command": (f"tools/hf_make_reference.py --new-tokens {args.new_tokens} "
                        f"--min-margin {args.min_margin} --max-attempts {args.max_attempts}"),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        "cases": cases,
    }
    # indented, but every list of numbers on one line: small diffs, short file
    text = json.dumps(ref, indent=1)
    text = re.sub(r"\[\s*([-0-9.e+,\s]*?)\s*\]",
                  lambda m: "[" + ",".join(m.group(1).split()).replace(",,", ",") + "]", text)
    with open(args.out, "w") as f:
        f.write(text + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
