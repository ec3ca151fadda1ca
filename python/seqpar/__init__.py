"""seqpar: sequence (context) parallel attention on PyTorch tensors and NumPy arrays.

Every rank holds the tokens of its shard of the sequence, ``[B, S_local, H, D]`` like flash-attn
and ring-flash-attention, and gets the attention of its queries over the whole sequence::

    import seqpar, torch

    def rank(comm):
        q, k, v = (seqpar.Partition(S, comm.size).shard(t, comm.rank) for t in (Q, K, V))
        return seqpar.attention(q, k, v, comm=comm, strategy="ring", causal=True)

    outs = seqpar.ThreadWorld(2).run(rank)          # ranks as threads of this process
    # or, under mpirun -np 2 python3 script.py:  rank(seqpar.MpiComm())
    # or, under torchrun --nproc-per-node 2 script.py:  rank(seqpar.TorchComm())

Inputs are read in place when they are contiguous (torch CPU tensors or NumPy arrays of fp32,
bf16 (torch only) or fp16); the result has the input's kind and dtype. ``[S, B, H, D]`` tensors
(Megatron's layout) are passed as ``x.transpose(0, 1)``, which seqpar copies to make contiguous,
or better made ``[B, S, H, D]`` once upstream.

The models run on a mesh the same way: ``seqpar.CausalLM.from_pretrained(path, tp=2,
ring_degree=2).generate(ids, 16)`` (a Llama, Qwen2 or Qwen3 directory; ``seqpar.Llama`` is the
same class) and ``seqpar.WanTransformer.from_pretrained(path)(latents, t,
prompt_embeds)`` (seqpar/models.py).

Errors: bad arguments raise ValueError with the library's one-line message; communication
failures raise CommError (a RuntimeError), deadlines CommTimeout (a CommError and TimeoutError).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import tempfile
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from . import _core
from ._core import Comm, CommError, CommTimeout

# At exit, ThreadWorld.run calls still in progress (in the script's daemon threads) are stopped
# as Ctrl-C stops them and waited for (at most 10 s) before CPython ends daemon threads, and later
# runs are refused. Registered before .models: atexit runs last what it got first, so the models
# still open are closed before this.
atexit.register(_core._stop_runs_at_exit, 10.0)

__all__ = [
    "attention",
    "decode_attention",
    "Comm",
    "CommError",
    "CommTimeout",
    "ThreadWorld",
    "MpiComm",
    "TorchComm",
    "Stats",
    "Partition",
    "Mesh",
    "plan",
    "version",
    "ModelMesh",
    "CausalLM",
    "Llama",
    "WanTransformer",
    "QwenImageTransformer",
    "FluxTransformer",
]

__version__ = _core.version()


def version() -> str:
    """The version of the seqpar library inside this module."""
    return _core.version()


# ---- tensors ---------------------------------------------------------------------------------


def _brief(value) -> str:
    """repr(value) on one line of at most 60 characters, for messages."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _torch():
    """PyTorch if this process has imported it, else None: a torch tensor can only come from a
    process that did (NumPy users need no torch, and importing it takes seconds)."""
    return sys.modules.get("torch")


def _torch_dtypes(torch):
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


class _Arg:
    """One tensor argument as the core reads it: memory by address with its strides (in
    elements; a transposed or sliced tensor is read where it lies), kept alive."""

    def __init__(self, name: str, x: Any):
        torch = _torch()
        if torch is not None and isinstance(x, torch.Tensor):
            if x.device.type != "cpu":
                raise ValueError(f"{name}: seqpar computes on the CPU; got a tensor on {x.device}")
            dtypes = _torch_dtypes(torch)
            if x.dtype not in dtypes:
                raise ValueError(f"{name}: dtype {x.dtype} is not supported; valid: float32, "
                                 "bfloat16, float16")
            x = x.detach()
            self.kind, self.dtype, self.address = "torch", dtypes[x.dtype], x.data_ptr()
            self.strides = [int(s) for s in x.stride()]
        elif isinstance(x, np.ndarray):
            names = {np.dtype(np.float32): "fp32", np.dtype(np.float16): "fp16"}
            if x.dtype not in names:
                raise ValueError(f"{name}: dtype {x.dtype} is not supported; valid: float32, "
                                 "float16 (bfloat16 through torch)")
            if any(s < 0 or s % x.itemsize for s in x.strides):
                x = np.ascontiguousarray(x)  # reversed or unaligned strides: one copy
            self.kind, self.dtype = "numpy", names[x.dtype]
            self.strides = [s // x.itemsize for s in x.strides]
            self.address = x.__array_interface__["data"][0]
        else:
            raise ValueError(f"{name}: expected a torch.Tensor or numpy.ndarray, got "
                             f"{type(x).__name__}")
        if x.ndim != 4:
            raise ValueError(f"{name}: expected (batch, tokens, heads, head_dim), got shape "
                             f"{tuple(x.shape)}")
        self.tensor = x
        self.shape = [int(d) for d in x.shape]

    def buffer(self):
        return _core._Buffer(self.address, self.shape, self.strides)


def _same_kind(args: Sequence[_Arg]) -> None:
    first = args[0]
    for a in args[1:]:
        if a.kind != first.kind or a.dtype != first.dtype:
            raise ValueError(f"q, k and v must be of one kind and dtype; got {first.kind} "
                             f"{first.dtype} and {a.kind} {a.dtype}")


def _empty_like(a: _Arg, shape: Sequence[int]):
    """An output in a's kind and dtype (bf16/fp16 results are converted into it)."""
    if a.kind == "torch":
        return a.tensor.new_empty(tuple(shape))
    return np.empty(tuple(shape), dtype=a.tensor.dtype)


def _wrap(a: _Arg, buf):
    """An fp32 result buffer of seqpar's as a's kind, without a copy (the array keeps it alive)."""
    arr = np.asarray(buf)
    return _torch().from_numpy(arr) if a.kind == "torch" else arr


def _result(a: _Arg, out_shape, core_call):
    if a.dtype == "fp32":
        out, *rest = core_call(_core._Buffer(0, []))
        return (_wrap(a, out), *rest)
    out = _empty_like(a, out_shape)
    address = out.data_ptr() if a.kind == "torch" else out.__array_interface__["data"][0]
    _, *rest = core_call(_core._Buffer(address, list(out_shape)))
    return (out, *rest)


# ---- attention -------------------------------------------------------------------------------


def _call(name, q, k, v, comm, options, return_lse):
    """One call of the library's entry point on this rank's tensors (k, v may differ in length
    from q over a cache); options by the vocabulary's names."""
    if not isinstance(comm, Comm):
        raise ValueError(f"comm {_brief(comm)} is not a communicator; pass the comm "
                         "ThreadWorld.run hands each rank, seqpar.MpiComm() or seqpar.TorchComm()")
    args = [_Arg("q", q), _Arg("k" if name == "attention" else "k_cache", k),
            _Arg("v" if name == "attention" else "v_cache", v)]
    _same_kind(args)
    qa, ka, va = args
    a = _core._AttentionArgs()
    a.dtype = qa.dtype
    for key, value in options.items():
        setattr(a, key, value)
    out, lse = _result(qa, qa.shape, lambda out_buf: _core._attention(
        comm, qa.buffer(), ka.buffer(), va.buffer(), out_buf, a))
    return (out, _wrap(qa, lse)) if return_lse else out


# core/limits.h's bounds, the command line's: any degree; the threads of this process (ranks x
# threads per rank); a sequence, a cache, text tokens; attention heads.
_MAX_RANKS, _MAX_THREADS, _MAX_TOKENS, _MAX_HEADS = (
    _core._LIMITS[k] for k in ("ranks", "threads", "tokens", "heads"))


def _int(name: str, value: Optional[int], low: int = 0, high: int = _MAX_TOKENS) -> int:
    """An integer keyword in [low, high] (None: 0, chosen by the library); bools and floats are
    refused."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} {_brief(value)} is not an integer")
    if int(value) < low:
        raise ValueError(f"{name} {value} is invalid; it must be at least {max(low, 1)}")
    if int(value) > high:
        raise ValueError(f"{name} {value} is out of range; valid: {max(low, 1)} to {high}")
    return int(value)


def _text(name: str, value: Optional[str], default: str = "") -> str:
    """A text keyword (None: default); anything but a str is refused."""
    if value is None:
        return default
    if not isinstance(value, str):
        raise ValueError(f"{name} {_brief(value)} is not a string")
    return value


def _flag(name: str, value) -> bool:
    """A True/False keyword; anything else (1, "no", None) is refused rather than read as one."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{name} {_brief(value)} is not True or False")


def _real(name: str, value, low: float, high: float) -> float:
    """A number keyword in [low, high]; bools, text and non-finite values are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} {_brief(value)} is not a number")
    if not (low <= float(value) <= high):
        raise ValueError(f"{name} {_brief(value)} is out of range; valid: {low} to {high}")
    return float(value)


def _scale(softmax_scale: Optional[float]) -> float:
    """softmax_scale as the library takes it: 0 for None (1/sqrt(head_dim)); 0, negatives,
    non-finite values, bools and text are refused (0 is not read as "the default")."""
    if softmax_scale is None:
        return 0.0
    if isinstance(softmax_scale, bool) or not isinstance(
            softmax_scale, (int, float, np.integer, np.floating)):
        raise ValueError(f"softmax_scale {_brief(softmax_scale)} is not a number; give a positive "
                         "finite number (None: 1/sqrt(head_dim))")
    scale = float(softmax_scale)
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"softmax_scale {_brief(softmax_scale)} is invalid; give a positive finite "
                         "number (None: 1/sqrt(head_dim))")
    return scale


def attention(q, k, v, *, comm: Comm, strategy: str = "ring", layout: str = "contiguous",
              causal: bool = False, ulysses_degree: Optional[int] = None,
              ring_degree: Optional[int] = None, sequence_parallel_size: Optional[int] = None,
              ulysses_mode: str = "uaa", pad: bool = False, seq_len: Optional[int] = None,
              text_tokens: int = 0, softmax: str = "online",
              softmax_scale: Optional[float] = None, schedule: str = "default",
              seq_lens: Optional[Sequence[int]] = None, hardware: str = "local",
              return_lse: bool = False):
    """Attention of this rank's queries over the whole sharded sequence.

    q: (B, S_local, H, D); k, v: (B, S_local, Hkv, D), Hkv dividing H (GQA). This rank's tokens
    are those ``Partition(S, comm.size, layout)`` gives it, S being the ranks' S_local summed;
    with layout "contiguous" the ranks may hold runs of any lengths (rank order).

    The keywords are the library's vocabulary, as ``seqpar run`` names its flags:
    strategy: "ring" (pass-KV, overlapped), "allgather", "ulysses", "usp" (ulysses_degree x
    ring_degree = sequence_parallel_size = the ranks), or "auto": the planner's fastest for this
    call on the `hardware` profile (``comm.last_choice`` says what it chose and why).
    layout: "contiguous", "striped", "zigzag" (balanced causal). ulysses_mode: "uaa" (any length
    and head count) or "strict". pad=True with seq_len: the ranks hold a sequence padded past
    seq_len real tokens; keys at positions >= seq_len are masked. text_tokens=T: the last T rows
    of q, k, v are text tokens replicated on every rank (MMDiT joint attention, bidirectional);
    the output's last T rows are theirs. softmax: "online" or "const-max" (rings only).
    softmax_scale: default 1/sqrt(D). schedule: "default" or "steal" (ring, contiguous shards:
    the ranks holding late tokens hand query rows to the others). seq_lens: packed documents
    (varlen, flash-attn's cu_seqlens as lengths), summing to S: a query attends only keys of its
    own document; with layout "zigzag" or "striped" each document is split over the ranks on its
    own (``Partition(S, n, layout, seq_lens=...)`` shards it).

    Returns the output (B, S_local, H, D) in q's kind and dtype (ulysses and usp send it back in
    that dtype: a bf16 call's second all-to-all carries half the bytes of an fp32 one); with
    return_lse also the log-sum-exp (B, S_local, H), fp32, natural log. The GIL is released while
    seqpar computes.
    ``comm.last_stats`` then holds what the call did, ``comm.last_strategy`` what ran.
    """
    if pad and (seq_len is None or _int("seq_len", seq_len) < 1):
        raise ValueError("pad=True needs seq_len, the number of real tokens (at least 1)")
    options = dict(
        strategy=_text("strategy", strategy), layout=_text("layout", layout),
        causal=_flag("causal", causal),
        ulysses_degree=_int("ulysses_degree", ulysses_degree, 1, _MAX_RANKS),
        ring_degree=_int("ring_degree", ring_degree, 1, _MAX_RANKS),
        sequence_parallel_size=_int("sequence_parallel_size", sequence_parallel_size, 1,
                                    _MAX_RANKS),
        ulysses_mode=_text("ulysses_mode", ulysses_mode), pad=_flag("pad", pad),
        seq_len=_int("seq_len", seq_len), text_tokens=_int("text_tokens", text_tokens),
        softmax=_text("softmax", softmax), scale=_scale(softmax_scale),
        schedule=_text("schedule", schedule), hardware=_text("hardware", hardware),
        seq_lens=[] if seq_lens is None else [_int(f"seq_lens[{i}]", x, 1)
                                              for i, x in enumerate(seq_lens)])
    return _call("attention", q, k, v, comm, options, return_lse)


_PASSES = {"q": ("passq", "default"), "q-ring": ("passq", "ring"), "kv": ("passkv", "default"),
           "auto": ("auto", "default")}


def decode_attention(q, k_cache, v_cache, *, comm: Comm, strategy: Optional[str] = None,
                     schedule: str = "default", pass_: Optional[str] = None, causal: bool = True,
                     softmax_scale: Optional[float] = None, hardware: str = "local",
                     return_lse: bool = False):
    """Attention of new queries over a K/V cache sharded across the ranks (decode, partial
    prefill).

    q: (B, T_local, H, D) this rank's new queries (T_local may be 0); k_cache, v_cache:
    (B, P_local, Hkv, D) this rank's share of the cache. The ranks' cache rows in rank order are
    the sequence; the ranks' queries in rank order are its newest tokens (their keys and values
    are in the cache), so with causal=True each query sees the keys up to its own position.

    strategy: "passq" (queries all-gathered, partial states merge back by LSE; schedule "ring":
    Q blocks around the ring, overlapped with attention, partial states back in one all-to-all),
    "passkv" (the cache rotates around the ring) or "auto" (default): the planner's fastest on the
    `hardware` profile, Meta's rule beside it in ``comm.last_choice``. pass_ is the older
    spelling: "q", "q-ring", "kv", "auto". ``comm.last_stats`` holds what the call did;
    ``comm.last_strategy`` and ``comm.last_pass`` which pass ran.
    """
    if pass_ is not None:
        if strategy is not None:
            raise ValueError("give strategy (and schedule) or its older spelling pass_, not both")
        if not isinstance(pass_, str) or pass_ not in _PASSES:
            raise ValueError(f"pass_ {_brief(pass_)} is unknown; valid: auto, q, q-ring, kv")
        strategy, schedule = _PASSES[pass_]
    options = dict(strategy=_text("strategy", strategy, "auto"),
                   schedule=_text("schedule", schedule), causal=_flag("causal", causal),
                   scale=_scale(softmax_scale), hardware=_text("hardware", hardware),
                   over_cache=True)
    return _call("decode_attention", q, k_cache, v_cache, comm, options, return_lse)


# ---- communicators ---------------------------------------------------------------------------


@dataclass
class Stats:
    """What the last attention call did on this rank (the per-rank figures of `seqpar run`).

    bytes_sent, bytes_recv: bytes this rank moved (all communicators of the strategy);
    bytes_by_op: {"send_recv": (sent, recv), "all_to_all": ..., ...};
    seconds: wall time of the call; compute_seconds: in the kernel and merges; wait_seconds:
    blocked on communication; exposed_comm_fraction: (wait - end sync) / seconds, as
    ``exposed_comm_fraction`` of ``seqpar run --json``; peak_kv_bytes, measured_kv_bytes: K/V
    held at once (predicted, allocated); work: visible score elements; fallback_rows:
    const-max rows that fell back to online softmax; input_addresses: where the strategy read q,
    k and v (the caller's memory when nothing was copied).
    """

    bytes_sent: int = 0
    bytes_recv: int = 0
    bytes_by_op: dict = field(default_factory=dict)
    seconds: float = 0.0
    compute_seconds: float = 0.0
    wait_seconds: float = 0.0
    end_sync_seconds: float = 0.0
    exposed_comm_fraction: float = 0.0
    peak_kv_bytes: int = 0
    measured_kv_bytes: int = 0
    work: int = 0
    fallback_rows: int = 0
    input_addresses: tuple = (0, 0, 0)


Comm.last_stats = property(lambda self: Stats(**self._last_stats()),
                           doc="Stats of the last attention call on this rank.")


def _seconds(name: str, value) -> float:
    """A positive, finite number of seconds (bools and strings refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} {_brief(value)} is not a number of seconds")
    seconds = float(value)
    if not np.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{name} {_brief(value)} is out of range; valid: 0.001 to 604800 seconds")
    return seconds


def _set_timeout(self, seconds: float) -> None:
    """Sets the deadline of every communication wait of this rank, in seconds."""
    self._set_timeout(_seconds("timeout", seconds))


Comm.set_timeout = _set_timeout
_core_abort = Comm.abort


def _abort(self, message: str) -> None:
    if not isinstance(message, str):  # (pybind would answer with its "Invoked with" dump)
        raise ValueError(f"message {_brief(message)} is not a string; give the failure's text")
    _core_abort(self, message)


_abort.__doc__ = _core_abort.__doc__
Comm.abort = _abort


class ThreadWorld:
    """n ranks as threads of this process (seqpar's threads backend; no launcher).

    ``ThreadWorld(4).run(fn, *args)`` calls ``fn(comm, *args)`` on 4 threads, one per rank, and
    returns their results in rank order. Each thread holds the GIL only while it runs Python;
    seqpar calls release it. A rank's exception stops the others' communication and is raised
    by run(). A rank's comm is valid only inside run().

    timeout: seconds every communication wait may take (default SEQPAR_TIMEOUT_S or 60).
    threads: kernel threads per rank (default cores / n); n x threads at most 4096 (the command
    line's bound, core/limits.h) and the process limit RLIMIT_NPROC.
    """

    def __init__(self, n: int, *, timeout: Optional[float] = None, threads: Optional[int] = None):
        self.n = _int("ranks", n, 1, _MAX_RANKS)
        self.timeout = 0.0 if timeout is None else _seconds("timeout", timeout)
        self.threads = _int("threads", threads, 1, _MAX_THREADS)
        _core._check_threads(self.n, self.threads)  # the command line's bounds, at once

    def run(self, fn: Callable[..., Any], *args, **kwargs) -> List[Any]:
        return _core._run_threads(self.n, lambda comm: fn(comm, *args, **kwargs), self.timeout,
                                  self.threads)


def MpiComm(mpi4py_comm=None) -> Comm:
    """seqpar's communicator over an mpi4py communicator (default MPI.COMM_WORLD), so a script
    launched with ``mpirun -np N python3 script.py`` shares its MPI world with seqpar.

    Collective over that communicator. seqpar uses a duplicate of it; mpi4py keeps initializing
    and finalizing MPI. Refused when the environment announces a larger world than MPI's (a
    script started by torchrun: use TorchComm).
    """
    # An mpi4py communicator comes from a process that imported mpi4py (none is imported here).
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi4py_comm is not None and not (mpi and isinstance(mpi4py_comm, mpi.Comm)):
        raise ValueError(f"mpi4py_comm {_brief(mpi4py_comm)} is not an mpi4py communicator; "
                         "valid: an mpi4py.MPI.Comm, or None (MPI.COMM_WORLD)")
    return _core._mpi_comm(mpi4py_comm)


_torch_comms: "weakref.WeakSet[Comm]" = weakref.WeakSet()
_previous_excepthook = None


def _announce_uncaught(kind, value, tb):
    """sys.excepthook while TorchComms live: an uncaught exception is announced to the other
    ranks (Comm.abort) before the process exits, so they fail at once with its message."""
    for comm in list(_torch_comms):
        try:
            comm.abort(f"{kind.__name__}: {value}".splitlines()[0])
        except Exception:  # a closed comm
            pass
    (_previous_excepthook or sys.__excepthook__)(kind, value, tb)


def TorchComm(group=None) -> Comm:
    """seqpar's communicator over a torch.distributed process group (gloo: CPU tensors), so a
    script launched with ``torchrun --nproc-per-node N script.py`` shares its world with seqpar.

    group: a gloo process group (default: the default group; when torch.distributed is not
    initialized yet and torchrun's environment is set, it is initialized with gloo). seqpar's
    sub-groups are made with torch.distributed.new_group. ``comm.abort(message)`` makes the
    other ranks' communication fail with that message; an uncaught exception does so too (this
    installs a sys.excepthook that calls the previous one).
    """
    global _previous_excepthook
    comm = _core._torch_comm(group)
    if sys.excepthook is not _announce_uncaught:
        _previous_excepthook = sys.excepthook
        sys.excepthook = _announce_uncaught
    _torch_comms.add(comm)
    return comm


# ---- partitions and meshes -------------------------------------------------------------------


class Partition:
    """Which global token positions each rank holds (the sharding every strategy assumes).

    layout: "contiguous" (rank r holds one run; the first S mod N ranks one token more),
    "striped" (token i on rank i mod N), "zigzag" (2N chunks, rank r holds chunks r and
    2N-1-r; balances causal work). seq_lens: packed documents summing to seq; zigzag and striped
    then split each document on its own (contiguous stays one run per rank).
    """

    def __init__(self, seq: int, ranks: int, layout: str = "contiguous",
                 seq_lens: Optional[Sequence[int]] = None):
        self.seq, self.ranks = _int("seq", seq, 1), _int("ranks", ranks, 1, _MAX_RANKS)
        self.layout = _text("layout", layout, "contiguous")
        # Any int64 length: the library names a bad one with its index.
        lens = [] if seq_lens is None else [_int(f"seq_lens[{i}]", x, -2**63, 2**63 - 1)
                                            for i, x in enumerate(seq_lens)]
        self._positions = [np.asarray(p) for p in
                           _core._partition_positions(self.seq, self.ranks, self.layout, lens)]

    def positions(self, rank: int) -> np.ndarray:
        """Ascending global positions of rank's tokens (int64)."""
        return self._positions[rank]

    def count(self, rank: int) -> int:
        return len(self._positions[rank])

    def shard(self, full, rank: int, dim: int = 1):
        """rank's rows of a full tensor (the sequence along `dim`, default 1 for [B, S, ...])."""
        pos = self._positions[rank]
        torch = _torch()
        if torch is not None and isinstance(full, torch.Tensor):
            if self.layout == "contiguous":  # one run: a view, made contiguous by the caller
                return full.narrow(dim, int(pos[0]), len(pos)).contiguous()
            return full.index_select(dim, torch.from_numpy(pos).to(full.device))
        return np.ascontiguousarray(np.take(full, pos, axis=dim))

    def unshard(self, shards: Sequence[Any], dim: int = 1):
        """The full tensor from every rank's shard (inverse of shard)."""
        first = shards[0]
        torch = _torch()
        shape = list(first.shape)
        shape[dim] = self.seq
        if torch is not None and isinstance(first, torch.Tensor):
            full = first.new_empty(shape)
            for r, s in enumerate(shards):
                full.index_copy_(dim, torch.from_numpy(self._positions[r]).to(full.device), s)
            return full
        full = np.empty(shape, dtype=first.dtype)
        for r, s in enumerate(shards):
            index = [slice(None)] * len(shape)
            index[dim] = self._positions[r]
            full[tuple(index)] = s
        return full


class Mesh:
    """The process mesh world = cfg x tp x ring x ulysses (outermost first), as ``seqpar mesh``.

    Names follow vLLM-Omni and xDiT. ranks: the world size to check against (default the
    product).
    """

    def __init__(self, *, ulysses_degree: int = 1, ring_degree: int = 1, tp: int = 1, cfg: int = 1,
                 ranks: Optional[int] = None):
        self.ulysses_degree = _int("ulysses_degree", ulysses_degree, 1, _MAX_RANKS)
        self.ring_degree = _int("ring_degree", ring_degree, 1, _MAX_RANKS)
        self.tp, self.cfg = _int("tp", tp, 1, _MAX_RANKS), _int("cfg", cfg, 1, 2)
        self.ranks = 0 if ranks is None else _int("ranks", ranks, 1, _MAX_RANKS)
        self.world_size = self.cfg * self.tp * self.ring_degree * self.ulysses_degree
        self.sequence_parallel_size = self.ulysses_degree * self.ring_degree

    def rows(self, heads: int, seq: int) -> List[dict]:
        """One dict per rank, the rows of ``seqpar mesh --json``: rank, cfg_rank, tp_rank,
        ulysses_rank, ring_rank, cp_rank, heads [first, end), tokens [first, end)."""
        return json.loads(_core._mesh_rows_json(self.cfg, self.tp, self.ring_degree,
                                                self.ulysses_degree, self.ranks,
                                                _int("heads", heads, 1, _MAX_HEADS),
                                                _int("seq", seq, 1)))


def plan(*, ranks: int = 8, model: Optional[str] = None, seq: int = 0, heads: int = 0,
         kv_heads: int = 0, head_dim: int = 128, batch: int = 1, causal: bool = False,
         frames: int = 0, height: int = 0, width: int = 0, text_tokens: Optional[int] = None,
         guidance: bool = True, hardware: str = "h100", ranks_per_node: Optional[int] = None,
         memory_limit_gb: float = 0.0, dtype: Optional[str] = None, cfg: int = 0, tp: int = 0,
         ulysses_degree: int = 0, ring_degree: int = 0, sequence_parallel_size: int = 0,
         strategy: Optional[str] = None, layout: Optional[str] = None,
         ulysses_mode: Optional[str] = None, softmax: Optional[str] = None,
         schedule: Optional[str] = None, pad: Optional[bool] = None, cached: int = 0,
         new: int = 0, top: int = 15, cfg_parallel_size: Optional[int] = None,
         tensor_parallel_size: Optional[int] = None,
         memory_limit: Optional[float] = None, simulate: bool = False,
         sim_ranks: Optional[str] = None, svg: Optional[str] = None) -> dict:
    """Which parallel layout to use, before anything runs: the ``seqpar plan --json`` object.

    A model preset (``model="wan2.1-t2v-14b", frames=33, height=240, width=432``, or
    ``model="llama3-405b", cached=124800, new=3200``) or one bare attention call (``seq``,
    ``heads``, ``kv_heads``, ``head_dim``, ``causal``) on ``ranks`` ranks of the ``hardware``
    profile (h100, h200, cpu-ethernet, local, or a JSON file). Degrees left 0 and options left
    None are enumerated (softmax None: online; ``softmax="const-max"`` plans ring and usp with
    the const-max softmax; schedule None: every schedule; sequence_parallel_size: ulysses_degree
    x ring_degree; cfg_parallel_size and tensor_parallel_size are cfg's and tp's other names,
    memory_limit memory_limit_gb's: the limit per rank in GB, 0 the profile's). ``top``: meshes
    with per-rank detail (0: all). Keys: seq_len, remainder, divisibility, meshes (fastest
    first), over_memory, rejected, and for decode the pass choice. With ``simulate`` (or
    ``svg``) also ``simulation``: the scaling replay at the sequence-parallel sizes ``sim_ranks``
    ("FIRST:LAST", doubling; default 8 up to 1024 as far as the planning limit allows), its chart
    written as an SVG file to ``svg`` when given, as ``seqpar plan --simulate --svg``.
    """
    s = _core._PlanSpec()
    s.model = _text("model", model)
    s.frames, s.height, s.width = (_int(n, v) for n, v in
                                   (("frames", frames), ("height", height), ("width", width)))
    s.seq, s.heads, s.kv_heads = _int("seq", seq), _int("heads", heads), _int("kv_heads", kv_heads)
    s.head_dim, s.batch = _int("head_dim", head_dim), _int("batch", batch)
    s.causal, s.guidance = _flag("causal", causal), _flag("guidance", guidance)
    s.text_tokens = None if text_tokens is None else _int("text_tokens", text_tokens)
    s.ranks = _int("ranks", ranks, 1, _MAX_RANKS)
    s.ranks_per_node = (None if ranks_per_node is None
                        else _int("ranks_per_node", ranks_per_node, 1, _MAX_RANKS))
    if memory_limit is not None:  # the flag's name (--memory-limit, in GB)
        if memory_limit_gb:
            raise ValueError("memory_limit and memory_limit_gb are the same limit; give one")
        memory_limit_gb = memory_limit
    s.memory_limit_gb = _real("memory_limit_gb", memory_limit_gb, 0.0, 1e9)
    s.dtype, s.strategy = _text("dtype", dtype), _text("strategy", strategy)
    s.layout, s.ulysses_mode = _text("layout", layout), _text("ulysses_mode", ulysses_mode)
    s.softmax, s.schedule = _text("softmax", softmax), _text("schedule", schedule)
    s.pad = None if pad is None else _flag("pad", pad)
    if cfg_parallel_size is not None:  # the vocabulary's names of cfg and tp
        cfg = cfg_parallel_size
    if tensor_parallel_size is not None:
        tp = tensor_parallel_size
    s.cfg, s.tp = _int("cfg", cfg, 0, _MAX_RANKS), _int("tp", tp, 0, _MAX_RANKS)
    s.ulysses_degree = _int("ulysses_degree", ulysses_degree, 0, _MAX_RANKS)
    s.ring_degree = _int("ring_degree", ring_degree, 0, _MAX_RANKS)
    s.sequence_parallel_size = _int("sequence_parallel_size", sequence_parallel_size, 0, _MAX_RANKS)
    s.cached, s.new = _int("cached", cached), _int("new", new)
    hardware, top = _text("hardware", hardware), _int("top", top, 0, _MAX_RANKS)
    simulate = _flag("simulate", simulate) or svg is not None
    path = None
    if svg is not None:  # checked before the planning runs
        path = _text("svg", os.fspath(svg) if isinstance(svg, os.PathLike) else svg)
        if not path:
            raise ValueError("svg '' is empty; give the chart's file name")
        if os.path.exists(path) and os.path.exists(hardware) and os.path.samefile(path, hardware):
            raise ValueError(f"svg {path!r} is the hardware profile this plan reads; write the "
                             "chart to another file")
    text, chart = _core._plan_json(s, hardware, top, simulate, _text("sim_ranks", sim_ranks))
    if path is not None:  # written beside it, then renamed: the file appears whole or not at all
        fd, part = tempfile.mkstemp(prefix=".svg-", dir=os.path.dirname(path) or ".")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(chart)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(part, 0o666 & ~umask)  # as open() would have made it
            os.replace(part, path)
        except BaseException:
            os.unlink(part)
            raise
    return json.loads(text)


from .models import (CausalLM, FluxTransformer, Llama, ModelMesh,  # noqa: E402
                     QwenImageTransformer, WanTransformer)
