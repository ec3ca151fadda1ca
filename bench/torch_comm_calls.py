"""Ring attention over seqpar.TorchComm (gloo) on 2 processes with torchrun's environment: the
time per call of a small call (mostly the two waits of the ring step and the per-call
all-gather) and a larger one (mostly the kernel), so a change to how TorchComm waits shows.

    PYTHONPATH=build/python build/pyenv/bin/python bench/torch_comm_calls.py [--rounds 3]

Prints rank 0's milliseconds per call for each round (calls in a row after 3 warm-ups).
"""

import argparse
import os
import socket
import subprocess
import sys
import time

SHAPES = [(64, 2, 16, 400), (4096, 8, 64, 10)]  # tokens, heads, head dim, calls a round


def rank_main(rounds):
    import torch

    import seqpar

    comm = seqpar.TorchComm()
    r = comm.rank
    g = torch.Generator().manual_seed(0)
    for S, H, D, calls in SHAPES:
        x = [seqpar.Partition(S, 2).shard(torch.randn(1, S, H, D, generator=g), r)
             for _ in range(3)]
        for _ in range(3):
            seqpar.attention(*x, comm=comm, strategy="ring")
        ms = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(calls):
                seqpar.attention(*x, comm=comm, strategy="ring")
            ms.append((time.perf_counter() - t0) / calls * 1e3)
        if r == 0:
            print(f"{S} tokens, {H} heads of {D}: ms/call " + " ".join(f"{m:.3f}" for m in ms),
                  flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    if "RANK" in os.environ:
        return rank_main(a.rounds)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [subprocess.Popen([sys.executable, __file__, "--rounds", str(a.rounds)],
                              env=dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                                       RANK=str(r), WORLD_SIZE="2", OMP_NUM_THREADS="1"))
             for r in range(2)]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
