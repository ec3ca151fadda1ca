#!/usr/bin/python3
"""Where the PyTorch peer's time goes: attend() of ../shared/peer/torch_cp_peer.py, one operation
at a time, on one thread, at the per-rank shape of one ring step (H heads, Sq queries, Sk keys).

usage: bench/peer_profile.py [--heads 8] [--sq 2048] [--sk 2048] [--head-dim 128] [--causal]
                             [--reps 3]

Prints a markdown table: seconds and share of each operation, and the matmuls' own GFLOP/s (to
compare with bench/gemm_bench run at the same moment). Run with Debian's /usr/bin/python3 and
python3-torch, as bench/compare_peer.sh does (OPENBLAS_CORETYPE as there).
"""
import argparse
import math
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--sq", type=int, default=2048)
    p.add_argument("--sk", type=int, default=2048)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    h, sq, sk, d = a.heads, a.sq, a.sk, a.head_dim
    q, k, v = torch.randn(h, sq, d), torch.randn(h, sk, d), torch.randn(h, sk, d)
    scale = 1.0 / math.sqrt(d)
    mask = torch.arange(sq).unsqueeze(1) >= torch.arange(sk).unsqueeze(0) if a.causal else None

    def timed(f):  # best of reps, after one warm-up
        r = f()
        best = float("inf")
        for _ in range(a.reps):
            t = time.perf_counter()
            r = f()
            best = min(best, time.perf_counter() - t)
        return best, r

    # The same operations, in the same order, as torch_cp_peer.attend().
    parts = []
    t, s0 = timed(lambda: torch.matmul(q, k.transpose(1, 2)))
    parts.append(("Q·Kᵀ (torch.matmul)", t))
    t, s = timed(lambda: s0 * scale)
    parts.append(("* scale", t))
    if mask is not None:
        t, s = timed(lambda: s.masked_fill(~mask, float("-inf")))
        parts.append(("masked_fill", t))
    t, lse = timed(lambda: torch.logsumexp(s, dim=-1))
    parts.append(("logsumexp", t))
    t, pr = timed(lambda: torch.exp(s - lse.unsqueeze(-1)))
    parts.append(("exp(s - lse)", t))
    t, pr = timed(lambda: torch.nan_to_num(pr, nan=0.0))
    parts.append(("nan_to_num", t))
    t, _ = timed(lambda: torch.matmul(pr, v))
    parts.append(("P·V (torch.matmul)", t))

    total = sum(t for _, t in parts)
    visible = 0.5 if a.causal else 1.0
    flops = 4.0 * h * sq * sk * d
    mm = parts[0][1] + parts[-1][1]
    print(f"peer attend(): H {h}, {sq} x {sk}, D {d}, causal {a.causal}, torch {torch.__version__},"
          f" 1 thread: {total:.3f} s, {flops * visible / total / 1e9:.1f} GFLOP/s (visible flops)")
    print()
    print("| operation | seconds | share |")
    print("|---|---|---|")
    for name, t in parts:
        print(f"| {name} | {t:.3f} | {100 * t / total:.0f}% |")
    print()
    print(f"matmuls: {100 * mm / total:.0f}% of the time, {flops / mm / 1e9:.1f} GFLOP/s "
          f"(all {h}x{sq}x{sk} scores, masked ones included)")


if __name__ == "__main__":
    main()
