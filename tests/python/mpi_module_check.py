"""Run under mpirun by test_module_mpi.py: seqpar on mpi4py's MPI world, every strategy against
PyTorch on the unsharded tensors. Prints one line per case on rank 0; exits 1 on any mismatch."""

import sys

from mpi4py import MPI

from module_env import TOL_BF16, TOL_F32, qkv, reference, torch

import seqpar


world = MPI.COMM_WORLD
comm = seqpar.MpiComm(world)
assert comm.rank == world.Get_rank() and comm.size == world.Get_size()
assert comm.backend == "mpi"
n = comm.size
cases = [("ring", "zigzag", {}), ("allgather", "striped", {}), ("ulysses", "contiguous", {}),
         ("usp", "zigzag", {"ulysses_degree": 2} if n % 2 == 0 else {})]
failed = 0
for dtype, tol in ((torch.float32, TOL_F32), (torch.bfloat16, TOL_BF16)):
    q, k, v = qkv(2, 72, 4, 2, 16, dtype=dtype)  # the same seeded tensors on every rank
    for strategy, layout, extra in cases:
        for causal in (False, True):
            part = seqpar.Partition(72, n, layout)
            x = [part.shard(t, comm.rank) for t in (q, k, v)]
            out = seqpar.attention(*x, comm=comm, strategy=strategy, layout=layout,
                                   causal=causal, **extra)
            full = part.unshard(world.allgather(out))
            want, _ = reference(q, k, v, causal=causal)
            err = (full.double() - want).abs().max().item()
            ok = out.dtype == dtype and err < tol
            failed += not ok
            if comm.rank == 0:
                print(f"{strategy} {layout} causal={causal} {dtype}: max err {err:.2e} "
                      f"{'ok' if ok else 'FAILED'} (sent {comm.last_stats.bytes_sent} bytes)")

# A bad argument is the same ValueError on every rank.
try:
    seqpar.attention(q, k, v, comm=comm, strategy="bogus")
    failed += 1
except ValueError as e:
    failed += "strategy 'bogus' is unknown" not in str(e)
sys.exit(1 if world.allreduce(failed) else 0)
