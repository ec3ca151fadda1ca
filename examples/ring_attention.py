"""Zigzag ring attention with seqpar, the way ring-flash-attention's tests read: every rank makes
the same full q, k, v, keeps its shard, calls attention, and the gathered output is checked
against PyTorch's attention on the full tensors.

    python3 examples/ring_attention.py --ranks 4           # ranks as threads
    mpirun -np 4 python3 examples/ring_attention.py --mpi   # ranks as MPI processes (mpi4py)
"""

import argparse
import sys

import torch

import seqpar


def main(comm, seq=1024, heads=8, head_dim=64, dtype=torch.bfloat16):
    # The same full tensors on every rank. A generator of its own per rank: ranks as threads
    # would share torch's default one.
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, seq, heads, head_dim, generator=g).to(dtype) for _ in range(3))

    part = seqpar.Partition(seq, comm.size, "zigzag")  # rank r: chunks r and 2N-1-r
    local_q, local_k, local_v = (part.shard(t, comm.rank) for t in (q, k, v))
    local_out = seqpar.attention(local_q, local_k, local_v, comm=comm, strategy="ring",
                                 layout="zigzag", causal=True)

    ref = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2).float() for t in (q, k, v)), is_causal=True).transpose(1, 2)
    return local_out, part.shard(ref, comm.rank), comm.last_stats


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--mpi", action="store_true")
    args = ap.parse_args()
    if args.mpi:
        from mpi4py import MPI
        results = MPI.COMM_WORLD.allgather(main(seqpar.MpiComm(MPI.COMM_WORLD))[:2])
        show = MPI.COMM_WORLD.Get_rank() == 0
    else:
        results = seqpar.ThreadWorld(args.ranks).run(main)
        show = True
    err = max((out.float() - ref).abs().max().item() for out, ref, *_ in results)
    if show:
        print(f"ring attention, zigzag, {len(results)} ranks: max |out - ref| = {err:.2e}")
    sys.exit(0 if err < 2e-2 else 1)
