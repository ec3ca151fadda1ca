"""seqpar.attention called from Python beside the same call through the C++ API (`seqpar run`,
which times context_parallel_attention the same way), in one run: rounds alternate between the
two so drift on a shared machine hits both alike. Prints both medians and their ratio.

    PYTHONPATH=build/python python3 bench/python_vs_cpp.py --seqpar build/seqpar
        [--seq 16384] [--ranks 2] [--heads 2] [--head-dim 64] [--dtype fp32] [--rounds 5]

Each side: the slowest rank's wall time per call (from a barrier to the call's return, so the
Python side includes argument handling, the per-call all-gather of the shapes, and wrapping the
result), median over its calls after one warm-up.
"""

import argparse
import json
import statistics
import subprocess
import time

import torch

import seqpar


def cpp_seconds(a):
    out = subprocess.run(
        [a.seqpar, "run", "--strategy", a.strategy, "--layout", a.layout, "--causal",
         "--ranks", str(a.ranks), "--seq", str(a.seq), "--heads", str(a.heads), "--head-dim",
         str(a.head_dim), "--dtype", a.dtype, "--threads", str(a.threads), "--repeat",
         str(a.calls), "--warmup", "1", "--json"],
        capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["seconds_all"]


def python_seconds(a):
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    part = seqpar.Partition(a.seq, a.ranks, a.layout)

    def rank(comm):
        n = part.count(comm.rank)
        g = torch.Generator().manual_seed(comm.rank)
        q, k, v = (torch.randn(1, n, a.heads, a.head_dim, generator=g).to(dtype)
                   for _ in range(3))
        times = []
        for i in range(1 + a.calls):
            comm.barrier()
            t0 = time.perf_counter()
            seqpar.attention(q, k, v, comm=comm, strategy=a.strategy, layout=a.layout,
                             causal=True)
            if i > 0:
                times.append(time.perf_counter() - t0)
        return times

    per_rank = seqpar.ThreadWorld(a.ranks, threads=a.threads).run(rank)
    return [max(ts) for ts in zip(*per_rank)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqpar", default="build/seqpar")
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--strategy", default="ring")
    ap.add_argument("--layout", default="zigzag")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=3, help="timed calls per round and side")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    cpp, py = [], []
    for r in range(a.rounds):
        cpp += cpp_seconds(a)
        py += python_seconds(a)
        print(f"round {r + 1}: C++ {statistics.median(cpp):.4f} s, "
              f"Python {statistics.median(py):.4f} s", flush=True)
    c, p = statistics.median(cpp), statistics.median(py)
    print(f"{a.strategy} {a.layout} causal, S={a.seq}, {a.ranks} ranks x {a.threads} threads, "
          f"H={a.heads}, D={a.head_dim}, {a.dtype}: C++ API {c:.4f} s, Python {p:.4f} s, "
          f"Python / C++ = {p / c:.4f} (median of {len(cpp)} calls each)")


if __name__ == "__main__":
    main()
