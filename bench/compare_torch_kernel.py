#!/usr/bin/env python3
"""seqpar's local attention kernel beside PyTorch's CPU flash-attention kernel, one thread each,
interleaved: for every round and shape, build/bench/kernel_bench (one shape, one round) and then
torch.ops.aten._scaled_dot_product_flash_attention_for_cpu on the same shape, dtype and mask.

usage: bench/compare_torch_kernel.py [--build build] [--seqs 4096,16384] [--head-dim 128]
                                     [--dtypes bf16,fp32] [--causal both|0|1] [--rounds 3]
                                     [--min-time 0.3]

Run it with the PyTorch of build/pyenv (2.2 or later has the kernel; build/pyenv/bin/python).
Shapes: one sequence, one head of S queries and S keys, D = --head-dim. GFLOP/s count 4·D flops per
visible score element on both sides (causal: the lower triangle). Each side's rate is the best
timing of at least --min-time seconds after a warm-up call; the ratio seqpar / torch is taken per
round, and the table gives each side's best rate and the ratio's min and median over the rounds.
kernel_bench's own GEMM references (fp32, or bf16 where the kernel multiplies bf16 in bf16) are
shown beside them. A benchmark: nothing passes or fails on timing.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch


def torch_rate(s, d, dtype, causal, min_time):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, s, d, generator=gen).to(dtype) for _ in range(3))
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    call = lambda: flash(q, k, v, 0.0, causal)
    call()
    calls, start = 0, time.perf_counter()
    while True:
        call()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            break
    visible = s * (s + 1) / 2 if causal else s * s
    return 4.0 * d * visible / (elapsed / calls) * 1e-9


def seqpar_rate(kernel_bench, s, d, dtype, causal, min_time):
    """(kernel GFLOP/s, GEMM 1024³ GFLOP/s, block GEMMs GFLOP/s, the GEMMs' type) of one row."""
    out = subprocess.run(
        [kernel_bench, "--seq", str(s), "--head-dim", str(d), "--causal", str(int(causal)),
         "--dtype", dtype, "--rounds", "1", "--threads", "1", "--min-time", str(min_time)],
        check=True, capture_output=True, text=True).stdout
    gemm_type = "bf16" if "GEMMs in bf16" in out else "fp32"
    rows = [line for line in out.splitlines() if line.startswith(f"| {s} |")]
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    return float(cells[7]), float(cells[8]), float(cells[10]), gemm_type


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--seqs", default="4096,16384")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--causal", default="both", choices=["both", "0", "1"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--min-time", type=float, default=0.3)
    a = p.parse_args()
    if not hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
        sys.exit(f"compare_torch_kernel.py: PyTorch {torch.__version__} has no CPU flash-attention "
                 "kernel (2.2 or later has it; run with build/pyenv/bin/python)")
    kernel_bench = os.path.join(a.build, "bench", "kernel_bench")
    if not os.access(kernel_bench, os.X_OK):
        sys.exit(f"compare_torch_kernel.py: {kernel_bench} not built (make build)")
    torch.set_num_threads(1)
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    causals = [False, True] if a.causal == "both" else [a.causal == "1"]
    shapes = [(dt, int(s), c) for dt in a.dtypes.split(",") for s in a.seqs.split(",")
              for c in causals]
    results = {shape: [] for shape in shapes}
    for _ in range(a.rounds):
        for dt, s, c in shapes:
            mine = seqpar_rate(kernel_bench, s, a.head_dim, dt, c, a.min_time)
            theirs = torch_rate(s, a.head_dim, dtypes[dt], c, a.min_time)
            results[(dt, s, c)].append((mine, theirs))
    print(f"torch {torch.__version__}, 1 thread each, D {a.head_dim}, {a.rounds} rounds, "
          f"min time {a.min_time} s")
    print()
    print("| dtype | S | causal | seqpar GFLOP/s | torch GFLOP/s | seqpar / torch min / median "
          "| GEMM 1024³ / block GEMMs GFLOP/s (their type) |")
    print("|---|---|---|---|---|---|---|")
    for (dt, s, c), runs in results.items():
        ratios = [m[0] / t for m, t in runs]
        print(f"| {dt} | {s} | {'yes' if c else 'no'} | {max(m[0] for m, _ in runs):.1f} | "
              f"{max(t for _, t in runs):.1f} | {min(ratios):.2f} / "
              f"**{statistics.median(ratios):.2f}** | {max(m[1] for m, _ in runs):.1f} / "
              f"{max(m[2] for m, _ in runs):.1f} ({runs[0][0][3]}) |")


if __name__ == "__main__":
    main()
