"""What the tests of the Python module share: the built module on sys.path, the PyTorch oracle,
and the launcher of MPI scripts.

SEQPAR_PYTHONPATH (set by tests/CMakeLists.txt) is the build tree's python/ folder, where the
package seqpar is assembled.
"""

import math
import os
import shutil
import subprocess
import sys

SEQPAR_PYTHONPATH = os.environ.get("SEQPAR_PYTHONPATH", "")
if SEQPAR_PYTHONPATH and SEQPAR_PYTHONPATH not in sys.path:
    sys.path.insert(0, SEQPAR_PYTHONPATH)

import torch  # noqa: E402

# fp32: seqpar's fp32 kernel against float64; measured max |err| 8.9e-7 over every strategy case.
TOL_F32 = 2e-6
# bf16/fp16 out: the output rounded once to 8 (bf16) or 11 (fp16) bits, |out| up to 2.8 here
# (half an ulp: 3.9e-3, 4.9e-4), plus the kernel's bf16/fp16 path; measured 5.8e-3 and 8.2e-4.
TOL_BF16 = 8e-3
TOL_F16 = 1e-3


def reference(q, k, v, causal=False, scale=None, q_pos=None, k_valid=None, seq_lens=None):
    """softmax(q kᵀ · scale) v and its log-sum-exp over the full (unsharded) tensors, computed by
    PyTorch in float64. q (B, S, H, D), k, v (B, S, Hkv, D); q_pos: global positions of q's rows
    (default 0..S-1, keys are 0..Sk-1); k_valid: number of real keys (the rest masked); seq_lens:
    packed documents (a query sees only keys of its own document)."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    H, Hkv, D = q.shape[2], k.shape[2], q.shape[3]
    k = k.repeat_interleave(H // Hkv, dim=2)
    v = v.repeat_interleave(H // Hkv, dim=2)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    Sq, Sk = q.shape[1], k.shape[1]
    qp = torch.arange(Sq) if q_pos is None else torch.as_tensor(q_pos)
    kp = torch.arange(Sk)
    mask = torch.ones(Sq, Sk, dtype=torch.bool)
    if causal:
        mask &= kp[None, :] <= qp[:, None]
    if k_valid is not None:
        mask &= kp[None, :] < k_valid
    if seq_lens is not None:
        doc = torch.repeat_interleave(torch.arange(len(seq_lens)), torch.tensor(seq_lens))
        mask &= doc[qp][:, None] == doc[kp][None, :]
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (B, H, Sq)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v)
    return out, lse.permute(0, 2, 1)


def qkv(B, S, H, Hkv, D, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, S, H, D, generator=g).to(dtype),
            torch.randn(B, S, Hkv, D, generator=g).to(dtype),
            torch.randn(B, S, Hkv, D, generator=g).to(dtype))


def mpirun(np_, script, *args, timeout=300):
    """Runs `python script args` on np_ MPI ranks; returns the completed process."""
    mpiexec = os.environ.get("SEQPAR_MPIEXEC") or shutil.which("mpirun")
    env = dict(os.environ, SEQPAR_PYTHONPATH=SEQPAR_PYTHONPATH, PYTHONPATH=SEQPAR_PYTHONPATH,
               OMP_NUM_THREADS="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [mpiexec, "--oversubscribe", "--mca", "btl_vader_single_copy_mechanism", "none",
           "-n", str(np_), sys.executable, script, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
