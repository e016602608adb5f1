#!/usr/bin/env python3
"""hpd-run against Hugging Face transformers on tiny random instances of each
released architecture, saved the way hub checkpoints are saved.

Run by hand (not part of CI); needs CPU torch and transformers from PyPI:

    python3 -m venv /tmp/hfenv && /tmp/hfenv/bin/pip install torch transformers
    /tmp/hfenv/bin/python tools/hf_checkpoints.py --hpd-run build/tools/hpd-run

For each architecture it builds the model with transformers' own classes
(random weights widened so that every layer matters), saves it in bf16 with
save_pretrained, sharded with an index, adds an `mtp.*` shard as the
releases ship one (Qwen3.5 also carries its vision tower, model.visual.*),
and compares:

- greedy tokens (a full forward per token, no cache) and the last step's
  logits with `hpd-run --logits-out` (transformers run in fp32 from the
  bf16 files, as the engine computes);
- stopping: an `eos_token_id` in generation_config.json set to a token the
  greedy run emits; transformers' `generate` and hpd-run must stop at the
  same place;
- tensor parallelism: `hpd-run --tp N` for each further degree of `--tp`
  (default 1,2) must give the tokens and the logits of the first, bit for
  bit.

Architectures: Qwen3NextForCausalLM with a mixture of experts,
Qwen3_5ForConditionalGeneration untied and tied, Qwen3_5MoeForConditional-
Generation, and FP8 variants of Qwen3-Next and Qwen3.5-MoE (projections
block-quantised to F8_E4M3 in 128x128 blocks with weight_scale_inv, as the
-FP8 releases; transformers dequantises them on a CPU).
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

H, VOCAB, LAYERS = 256, 1024, 4


def text_kwargs():
    return dict(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS,
                layer_types=["linear_attention"] * 3 + ["full_attention"],
                num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                linear_num_key_heads=2, linear_num_value_heads=4,
                linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4,
                max_position_embeddings=4096, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                 "partial_rotary_factor": 0.25})


MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
           shared_expert_intermediate_size=128)


def widen(model, seed):
    """transformers initialises norms to zero and projections with std 0.02,
    which makes every layer nearly the identity: widen them."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(0.1, 2.0)))
            elif "norm" in name:
                p.normal_(1.0 if "linear_attn.norm" in name else 0.0, 0.1)
            elif p.dim() >= 2:
                p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
            elif "dt_bias" in name:
                p.normal_(1.0, 0.1)
        emb = model.get_input_embeddings()
        emb.weight.normal_(0.0, 1.0)
        out = model.get_output_embeddings()
        if out is not None and out.weight is not emb.weight:
            out.weight.normal_(0.0, 3.0 / H ** 0.5)


def build(arch, seed):
    import transformers as tf

    if arch == "qwen3_next_moe":
        cfg = tf.Qwen3NextConfig(**text_kwargs(), intermediate_size=512, **MOE,
                                 norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                                 tie_word_embeddings=False)
        return tf.Qwen3NextForCausalLM(cfg)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=H)
    if arch in ("qwen3_5", "qwen3_5_tied"):
        cfg = tf.Qwen3_5Config(text_config=dict(**text_kwargs(), intermediate_size=512),
                               vision_config=vision, tie_word_embeddings=arch.endswith("tied"))
        return tf.Qwen3_5ForConditionalGeneration(cfg)
    if arch == "qwen3_5_moe":
        cfg = tf.Qwen3_5MoeConfig(text_config=dict(**text_kwargs(), **MOE),
                                  vision_config=vision, tie_word_embeddings=False)
        return tf.Qwen3_5MoeForConditionalGeneration(cfg)
    raise ValueError(arch)


def quantisable(name):
    skip = ("embed_tokens", "lm_head", "mlp.gate.", "shared_expert_gate", "visual", "mtp.")
    return "proj" in name and not any(s in name for s in skip)


def to_fp8(model_dir, block):
    """Rewrites the checkpoint's projection weights as F8_E4M3 blocks with
    weight_scale_inv, as the -FP8 releases are made, and says so in
    config.json's quantization_config."""
    from safetensors.torch import load_file, save_file

    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    with open(index_path) as f:
        index = json.load(f)
    for shard in sorted(set(index["weight_map"].values())):
        path = os.path.join(model_dir, shard)
        tensors = load_file(path)
        out = {}
        for name, t in tensors.items():
            if t.dim() < 2 or not quantisable(name):
                out[name] = t
                continue
            w = t.to(torch.float32)
            rows, cols = w.shape[-2:]
            rb, cb = -(-rows // block), -(-cols // block)
            pad = torch.zeros(*w.shape[:-2], rb * block, cb * block)
            pad[..., :rows, :cols] = w
            blocks = pad.unflatten(-2, (rb, block)).unflatten(-1, (cb, block))
            amax = blocks.abs().amax(dim=(-3, -1))  # [..., rb, cb]
            scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
            full = scale.repeat_interleave(block, -2).repeat_interleave(block, -1)
            q = (pad / full)[..., :rows, :cols].to(torch.float8_e4m3fn)
            out[name] = q.contiguous()
            out[name + "_scale_inv"] = scale.contiguous()
            index["weight_map"][name + "_scale_inv"] = shard
        save_file(out, path, metadata={"format": "pt"})
    with open(index_path, "w") as f:
        json.dump(index, f, indent=2)
    cfg_path = os.path.join(model_dir, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                  "activation_scheme": "dynamic",
                                  "weight_block_size": [block, block],
                                  "modules_to_not_convert": ["lm_head", "embed_tokens", "mlp.gate",
                                                             "shared_expert_gate"]}
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)


def add_mtp_shard(model_dir):
    """The releases' multi-token-prediction head, in a shard of its own."""
    from safetensors.torch import save_file

    shard = "model-mtp.safetensors"
    tensors = {"mtp.fc.weight": torch.randn(H, 2 * H).to(torch.bfloat16),
               "mtp.norm.weight": torch.randn(H).to(torch.bfloat16),
               "mtp.layers.0.input_layernorm.weight": torch.randn(H).to(torch.bfloat16)}
    save_file(tensors, os.path.join(model_dir, shard), metadata={"format": "pt"})
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    with open(index_path) as f:
        index = json.load(f)
    for name in tensors:
        index["weight_map"][name] = shard
    with open(index_path, "w") as f:
        json.dump(index, f, indent=2)


def load_fp32(model_dir):
    from transformers import AutoConfig
    import transformers as tf

    cfg = AutoConfig.from_pretrained(model_dir)
    cls = {"qwen3_next": tf.Qwen3NextForCausalLM,
           "qwen3_5": tf.Qwen3_5ForConditionalGeneration,
           "qwen3_5_moe": tf.Qwen3_5MoeForConditionalGeneration}[cfg.model_type]
    return cls.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    out, last = [], None
    with torch.no_grad():
        for _ in range(n):
            last = model(input_ids=ids, use_cache=False).logits[0, -1].float()
            tok = int(torch.argmax(last))
            out.append(tok)
            ids = torch.cat([ids, torch.tensor([[tok]])], dim=1)
    return out, last


def hpd_run(exe, model_dir, prompt, n, logits_file=None, tp=1):
    cmd = [exe, "--model", model_dir, "--prompt-ids", ",".join(map(str, prompt)),
           "--max-tokens", str(n), "--no-generation-defaults", "--tp", str(tp)]
    if logits_file:
        cmd += ["--logits-out", logits_file]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"hpd-run failed on {model_dir}:\n{res.stderr}")
    return [int(t) for t in res.stdout.split()]


def compare(args, name, arch, fp8, seed, root):
    model_dir = os.path.join(root, name)
    model = build(arch, seed)
    widen(model, seed)
    model.to(torch.bfloat16).save_pretrained(model_dir, max_shard_size="1MB")
    add_mtp_shard(model_dir)
    if fp8:
        to_fp8(model_dir, 128)
    del model
    hf = load_fp32(model_dir)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, VOCAB, (args.prompt_len,), generator=g).tolist()
    n = args.new_tokens
    hf_tokens, hf_logits = hf_greedy(hf, prompt, n)
    logits_file = os.path.join(model_dir, "hpd_logits.f32")
    ours = hpd_run(args.hpd_run, model_dir, prompt, n, logits_file, args.tp[0])
    # the other TP degrees (CPU ranks): the first's tokens and logits, bit
    # for bit (before generation_config.json gets an eos below)
    same_tp = []
    for tp in args.tp[1:]:
        tp_file = os.path.join(model_dir, f"hpd_logits_tp{tp}.f32")
        got = hpd_run(args.hpd_run, model_dir, prompt, n, tp_file, tp)
        with open(logits_file, "rb") as a, open(tp_file, "rb") as b:
            same_tp.append((tp, got == ours and a.read() == b.read()))
    agree = 0
    while agree < n and hf_tokens[agree] == ours[agree]:
        agree += 1
    line = f"{name:22s} tokens {agree:2d}/{n}"
    if agree == n:
        with open(logits_file, "rb") as f:
            raw = f.read()
        mine = torch.tensor(struct.unpack(f"<{len(raw) // 4}f", raw))
        rel = float(torch.linalg.norm(hf_logits - mine) / torch.linalg.norm(hf_logits))
        mx = float((hf_logits - mine).abs().max() / hf_logits.abs().max())
        line += f", last-step logits rel L2 {rel:.2e}, max abs / max {mx:.2e}"
    # stopping: the 6th greedy token as eos_token_id in generation_config.json
    eos = hf_tokens[5]
    with open(os.path.join(model_dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": eos, "do_sample": False}, f)
    hf = load_fp32(model_dir)
    with torch.no_grad():
        gen = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                          use_cache=False, eos_token_id=eos, pad_token_id=eos)
    hf_stop = gen[0, len(prompt):].tolist()
    ours_stop = hpd_run(args.hpd_run, model_dir, prompt, n)
    stop_ok = hf_stop == ours_stop and hf_stop[-1] == eos and len(hf_stop) < n
    line += f"; eos {eos}: transformers stops after {len(hf_stop)}, hpd-run after " \
            f"{len(ours_stop)} ({'same' if stop_ok else 'DIFFERENT'})"
    for tp, same in same_tp:
        line += f"; tp {tp}: {'same bits' if same else 'DIFFERENT'}"
    print(line, flush=True)
    return agree == n and stop_ok and all(same for _, same in same_tp)


CASES = [  # name, arch, fp8, seed
    ("qwen3-next-moe", "qwen3_next_moe", False, 1),
    ("qwen3.5-untied", "qwen3_5", False, 2),
    ("qwen3.5-tied", "qwen3_5_tied", False, 3),
    ("qwen3.5-moe", "qwen3_5_moe", False, 4),
    ("qwen3-next-moe-fp8", "qwen3_next_moe", True, 5),
    ("qwen3.5-moe-fp8", "qwen3_5_moe", True, 6),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hpd-run", default="build/tools/hpd-run")
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--dir", default=None, help="keep the checkpoints here")
    ap.add_argument("--tp", default="1,2", help="TP degrees: the first is compared with "
                    "transformers, the others with it bit for bit")
    args = ap.parse_args()
    args.tp = [int(t) for t in args.tp.split(",")]
    import transformers

    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    root = args.dir or tempfile.mkdtemp(prefix="hpd-hfck-")
    ok = all([compare(args, *c, root) for c in CASES])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
