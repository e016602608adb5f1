#!/usr/bin/env python3
"""Compare hpd-run with Hugging Face transformers on a small random Qwen3-Next.

Run by hand (not part of CI); needs CPU torch and transformers from PyPI:

    python3 -m venv /tmp/hfenv && /tmp/hfenv/bin/pip install torch transformers
    /tmp/hfenv/bin/python tools/hf_reference.py --hpd-run build/tools/hpd-run

It builds a random dense Qwen3-Next (num_experts 0) with transformers, saves it
with save_pretrained (so the loader reads the config.json that current
transformers writes), runs HF's greedy generation with a full forward pass per
token (no cache, so HF's chunked gated delta rule sees the whole sequence),
then runs hpd-run on the same directory and compares the tokens and the
logits of the last step.
"""
import argparse
import os
import struct
import subprocess
import sys
import tempfile

import torch


def build_model(args, out_dir):
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                   for i in range(args.layers)]
    cfg = Qwen3NextConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers, layer_types=layer_types,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=64, linear_value_head_dim=32, linear_conv_kernel_dim=4,
        num_experts=0, mlp_only_layers=[], tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                         "partial_rotary_factor": 0.25},
        max_position_embeddings=4096, rms_norm_eps=1e-6)
    torch.manual_seed(args.seed)
    model = Qwen3NextForCausalLM(cfg).to(torch.float32).eval()
    with torch.no_grad():
        # HF initialises norms to zero and projections with std 0.02, which makes
        # every layer nearly the identity; widen them so the layers matter.
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(0.1, 2.0)))
            elif "norm" in name:
                p.normal_(0.0, 0.1) if "linear_attn.norm" not in name else p.normal_(1.0, 0.1)
            elif p.dim() >= 2:
                fan_in = p.shape[-1]
                p.normal_(0.0, 1.0 / fan_in ** 0.5)
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
        model.lm_head.weight.normal_(0.0, 3.0 / args.hidden ** 0.5)
    model.save_pretrained(out_dir, safe_serialization=True)
    return model


def hf_greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    out = []
    last = None
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=ids, use_cache=False).logits[0, -1].float()
            last = logits
            tok = int(torch.argmax(logits))
            out.append(tok)
            ids = torch.cat([ids, torch.tensor([[tok]])], dim=1)
    return out, last


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hpd-run", default="build/tools/hpd-run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--prompt-len", type=int, default=150)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()

    out_dir = args.dir or tempfile.mkdtemp(prefix="hpd-hf-")
    model = build_model(args, out_dir)
    g = torch.Generator().manual_seed(args.seed + 1)
    prompt = torch.randint(0, args.vocab, (args.prompt_len,), generator=g).tolist()

    hf_tokens, hf_logits = hf_greedy(model, prompt, args.new_tokens)
    logits_file = os.path.join(out_dir, "hpd_logits.f32")
    cmd = [args.hpd_run, "--model", out_dir, "--prompt-ids", ",".join(map(str, prompt)),
           "--max-tokens", str(args.new_tokens), "--logits-out", logits_file]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        print(res.stderr, file=sys.stderr)
        sys.exit(1)
    hpd_tokens = [int(t) for t in res.stdout.split()]
    with open(logits_file, "rb") as f:
        raw = f.read()
    hpd_logits = torch.tensor(struct.unpack(f"<{len(raw) // 4}f", raw))

    agree = 0
    for a, b in zip(hf_tokens, hpd_tokens):
        if a != b:
            break
        agree += 1
    print(f"model dir: {out_dir}")
    print(f"prompt: {args.prompt_len} tokens, generated {args.new_tokens}")
    print(f"hf : {' '.join(map(str, hf_tokens))}")
    print(f"hpd: {' '.join(map(str, hpd_tokens))}")
    print(f"greedy tokens agreeing (leading run): {agree}/{args.new_tokens}")
    if agree == args.new_tokens:
        # both sides saw the same sequence, so the last-step logits are comparable
        diff = (hf_logits - hpd_logits).abs()
        rel = float(torch.linalg.norm(hf_logits - hpd_logits) / torch.linalg.norm(hf_logits))
        print(f"last-step logits: max abs diff {float(diff.max()):.3e}, relative L2 {rel:.3e}")
    sys.exit(0 if agree == args.new_tokens else 1)


if __name__ == "__main__":
    main()
