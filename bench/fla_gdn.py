#!/usr/bin/env python3
"""flash-linear-attention's gated delta rule on the shapes of hpd-bench-cuda.

Tooling only (bench/cuda.sh runs it beside hpd-bench-cuda on a GPU machine
with torch and Triton; the fla wheels come from tools/fetch-fla-wheels.sh).
Prints one line per kernel and dtype: "fla_<kernel> key=value ... ms=X".

    python3 bench/fla_gdn.py --seqs 32 --prefill 4096 [--reps 20]
"""
import argparse

import torch
from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

NK, NV, DK, DV = 16, 32, 128, 128


def timed(fn, reps):
    """Milliseconds per call: a warm-up (Triton compiles), then the best
    mean of 3 rounds, as hpd-bench-cuda does."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / reps)
    return best


def inputs(b, t, dtype):
    dev = "cuda"
    # Qwen3-Next's 16 key heads repeated to its 32 value heads, as
    # transformers does before it calls these kernels
    q = torch.nn.functional.normalize(torch.randn(b, t, NK, DK, device=dev), dim=-1).to(dtype)
    k = torch.nn.functional.normalize(torch.randn(b, t, NK, DK, device=dev), dim=-1).to(dtype)
    q = q.repeat_interleave(NV // NK, dim=2)
    k = k.repeat_interleave(NV // NK, dim=2)
    v = torch.randn(b, t, NV, DV, device=dev).to(dtype)
    g = -(torch.rand(b, t, NV, device=dev) * 0.19 + 0.01)  # log decay, fp32
    beta = (torch.rand(b, t, NV, device=dev) * 0.8 + 0.1).to(dtype)
    h0 = torch.randn(b, NV, DK, DV, device=dev) * 0.01  # fp32 state
    return q, k, v, g, beta, h0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, default=32)
    ap.add_argument("--prefill", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    for dtype, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        q, k, v, g, beta, h0 = inputs(a.seqs, 1, dtype)
        ms = timed(lambda: fused_recurrent_gated_delta_rule(
            q, k, v, g=g, beta=beta, scale=DK ** -0.5, initial_state=h0,
            output_final_state=True), a.reps)
        print(f"fla_gdn_recurrent dtype={name} seqs={a.seqs} ms={ms:.4f}", flush=True)
        for n in (1, 4):
            q, k, v, g, beta, h0 = inputs(n, a.prefill, dtype)
            ms = timed(lambda: chunk_gated_delta_rule(
                q, k, v, g, beta, scale=DK ** -0.5, initial_state=h0,
                output_final_state=True), a.reps)
            print(f"fla_gdn_chunked dtype={name} seqs={n} tokens={a.prefill} ms={ms:.4f} "
                  f"tok_per_s={n * a.prefill / ms * 1e3:.0f}", flush=True)


if __name__ == "__main__":
    main()
