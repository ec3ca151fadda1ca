"""The models on a mesh: ``CausalLM`` (greedy generation of a Hugging Face Llama, Qwen2 / Qwen2.5
or Qwen3 directory; ``Llama`` is the same class) and ``WanTransformer`` (the Wan 2.1 / 2.2
text-to-video transformer of a diffusers or original checkpoint), as ``seqpar generate`` and
``seqpar denoise`` run them.

Two ways to run a mesh of ``ModelMesh.ranks`` ranks:

* threads (no ``comm``): ``CausalLM.from_pretrained(path, tp=2, ring_degree=2)`` starts the ranks as
  threads of this process; they load their shares once and serve every later call, until
  ``close()`` (or the object is collected, or ``with`` ends).
* a rank's model (``comm=``): every rank of ``comm`` calls ``from_pretrained(path, comm=comm,
  ...)`` and then each call with the same arguments, as under ``mpirun -np N python3 script.py``
  with ``comm=seqpar.MpiComm()`` or inside ``seqpar.ThreadWorld(N).run(fn)``. Every rank returns
  the whole result.

Bad arguments raise ValueError (TypeError for weights_dtype's type) with a one-line message
naming the argument, in the caller's thread before any rank sees them; a refused call leaves the
model serving. The GIL is released while seqpar computes.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import os
import queue
import threading
import warnings
import weakref
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from . import _MAX_RANKS, _brief, _core, _flag, _text, _torch

_MAX_STEPS = _core._LIMITS["steps"]  # core/limits.h: denoising steps


@dataclass(frozen=True, init=False)
class ModelMesh:
    """A cfg x tp x ring_degree x ulysses_degree mesh, as the CLI's mesh flags.

    strategy: "ring" or "allgather", used when ulysses_degree is 1 (ulysses_degree > 1 runs
    Ulysses, with ring_degree > 1 too USP). layout: "contiguous", "striped", "zigzag".
    cfg: 2 runs the two guidance branches of a diffusion model side by side (Wan, Qwen-Image,
    FLUX.1).
    schedule: "default" or "steal" (ring, contiguous shards); softmax: "online" or "const-max"
    (the rings). The keywords also take the vocabulary's longer names: cfg_parallel_size,
    tensor_parallel_size, sequence_parallel_size (ulysses_degree x ring_degree, resolved as the
    CLI resolves it; alone: the ring degree).
    """

    tp: int = 1
    ring_degree: int = 1
    ulysses_degree: int = 1
    cfg: int = 1
    strategy: str = "ring"
    layout: str = "contiguous"
    ulysses_mode: str = "uaa"
    pad: bool = False
    schedule: str = "default"
    softmax: str = "online"

    def __init__(self, **keywords):
        _check_keywords("ModelMesh", keywords, ())
        keywords = dict(keywords)
        for long, short in _MESH_ALIASES.items():
            if long in keywords:
                if short in keywords:
                    raise ValueError(f"give {short} or {long}, not both")
                keywords[short] = keywords.pop(long)
        if "sequence_parallel_size" in keywords:
            sp = _degree("sequence_parallel_size", keywords.pop("sequence_parallel_size"))
            ring, ulysses = (_degree(k, keywords[k]) if k in keywords else None
                             for k in ("ring_degree", "ulysses_degree"))
            _, _, keywords["ring_degree"], keywords["ulysses_degree"] = \
                _core._resolve_degrees(None, None, ring, ulysses, sp)
        for f in fields(self):
            object.__setattr__(self, f.name, keywords.get(f.name, f.default))

    @property
    def ranks(self) -> int:
        return self.cfg * self.tp * self.ring_degree * self.ulysses_degree


# ModelMesh's keywords: its fields and the vocabulary's longer names.
_MESH_ALIASES = {"cfg_parallel_size": "cfg", "tensor_parallel_size": "tp"}
_MESH_KEYWORDS = ("tp", "tensor_parallel_size", "ring_degree", "ulysses_degree",
                  "sequence_parallel_size", "cfg", "cfg_parallel_size", "strategy", "layout",
                  "ulysses_mode", "pad", "schedule", "softmax")


def _check_keywords(where: str, keywords: dict, own) -> None:
    """ValueError naming the first keyword that is neither one of `own` nor a mesh keyword."""
    unknown = [k for k in keywords if k not in _MESH_KEYWORDS]
    if unknown:
        raise ValueError(f"{where}: keyword '{unknown[0]}' is unknown; valid: "
                         f"{', '.join([*own, *_MESH_KEYWORDS])}")


def _degree(name: str, value) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise ValueError(f"{name} {_brief(value)} is invalid; expected an integer")
    if not 1 <= value <= _MAX_RANKS:
        raise ValueError(f"{name} {value} is out of range; valid: 1 to {_MAX_RANKS}")
    return int(value)


def _mesh_of(mesh: Optional[ModelMesh], kwargs: dict, call: Callable) -> ModelMesh:
    """The mesh of call(path, *, mesh=None, ..., **kwargs): mesh, or ModelMesh(**kwargs)."""
    own = [k for k in inspect.signature(call).parameters if k not in ("path", "mesh_kwargs")]
    _check_keywords(call.__qualname__, kwargs, own)
    if mesh is not None and kwargs:
        raise ValueError(f"give the mesh as mesh=ModelMesh(...) or as keywords, not both "
                         f"(got {', '.join(sorted(kwargs))})")
    mesh = ModelMesh(**kwargs) if mesh is None else mesh
    if not isinstance(mesh, ModelMesh):
        raise ValueError(f"mesh: expected a seqpar.ModelMesh, got {type(mesh).__name__}")
    return mesh


def _mesh_dict(mesh: ModelMesh) -> dict:
    d = asdict(mesh)
    for k in ("tp", "ring_degree", "ulysses_degree", "cfg"):
        d[k] = _degree(k, d[k])
    for k in ("strategy", "layout", "ulysses_mode", "schedule", "softmax"):
        d[k] = _text(k, d[k])
    d["pad"] = _flag("pad", d["pad"])
    _core._check_model_mesh(d)  # the library's messages, before any rank starts
    return d


class _ThreadRanks:
    """The ranks of a mesh as threads of this process that stay alive between calls: each rank
    builds its model once (make(comm)), then runs the calls it is handed (job(model)) until
    closed. A ValueError or TypeError of a call (an argument refused alike on every rank, before
    any communication: the callers check theirs before handing a job over, and pybind's casts
    are the only TypeErrors a rank's job can raise) leaves the ranks serving; any other failure
    stops them."""

    def __init__(self, n: int, make: Callable, threads: Optional[int], timeout: Optional[float]):
        from . import ThreadWorld

        self.n = n
        self._jobs = [queue.Queue() for _ in range(n)]
        self._results: "queue.Queue" = queue.Queue()
        self._lock = threading.Lock()
        self._dead: Optional[BaseException] = None
        self._stopping = _core._StopFlag()  # set: the ranks stop where they are

        def rank(comm):
            try:
                model = make(comm)
            except BaseException as e:
                self._results.put((comm.rank, e))
                raise
            self._results.put((comm.rank, None))
            while True:
                job = self._jobs[comm.rank].get()
                if job is None:
                    return None
                try:
                    self._results.put((comm.rank, job(model)))
                except (ValueError, TypeError) as e:
                    self._results.put((comm.rank, e))
                except BaseException as e:
                    self._results.put((comm.rank, e))
                    raise

        w = ThreadWorld(n, threads=threads, timeout=timeout)  # its arguments checked here

        def world():
            try:
                _core._run_threads(w.n, rank, w.timeout, w.threads, self._stopping)
            except BaseException:  # reported through the results
                pass

        self._thread = threading.Thread(target=world, name="seqpar-ranks", daemon=True)
        self._thread.start()
        _OPEN_RANKS.add(self)
        self._collect()

    def _collect(self):
        results = [None] * self.n
        errors = []
        for _ in range(self.n):
            r, value = self._results.get()
            if isinstance(value, BaseException):
                errors.append(value)
            results[r] = value
        if errors:
            # The rank that failed first says why; the others' CommErrors only echo it.
            refused = (ValueError, TypeError)
            first = next((e for e in errors if isinstance(e, refused)), errors[0])
            if not all(isinstance(e, refused) for e in errors):
                self._stop(first)
            raise first
        return results

    def call(self, job: Callable[[Any], Any]) -> Any:
        """job(model) on every rank; rank 0's result."""
        with self._lock:
            if self._dead is not None:
                raise RuntimeError(f"the model's ranks have stopped ({self._dead}); load it again")
            for q in self._jobs:
                q.put(job)
            try:
                return self._collect()[0]
            except KeyboardInterrupt:
                # Ctrl-C: the ranks stop within about a second, and the model with them (a later
                # call would otherwise read this call's results). Their world is waited for, so
                # that no thread is left inside it when the interpreter exits.
                self._stop(RuntimeError("a call was interrupted (Ctrl-C)"))
                self._stopping.set()
                self._thread.join(timeout=30)
                raise

    def _stop(self, why: BaseException):
        self._dead = why
        for q in self._jobs:
            q.put(None)

    def close(self):
        if self._dead is None:
            self._stop(RuntimeError("closed"))
            self._thread.join()


# The models still open when the interpreter exits are closed while it still runs (atexit): their
# ranks' threads are joined before CPython ends the daemon threads, which it does wherever they
# next take the GIL. A call still running in another thread is stopped first.
_OPEN_RANKS: "weakref.WeakSet[_ThreadRanks]" = weakref.WeakSet()


@atexit.register
def _close_open_models():
    for ranks in list(_OPEN_RANKS):
        ranks._stopping.set()
        ranks.close()


class _Model:
    """What CausalLM and WanTransformer share: a rank's model on comm, or the whole mesh on
    threads."""

    def _start(self, make: Callable, comm, mesh: ModelMesh, threads, timeout):
        self.mesh = mesh
        if comm is not None:
            from . import Comm

            if not isinstance(comm, Comm):
                raise ValueError(f"comm {_brief(comm)} is not a communicator; valid: the comm "
                                 "ThreadWorld.run hands each rank, seqpar.MpiComm(), "
                                 "seqpar.TorchComm(), or None (the mesh's ranks as threads)")
            if threads is not None or timeout is not None:
                raise ValueError("threads and timeout are for the ranks from_pretrained starts "
                                 "as threads; with comm give neither (its world's own: "
                                 "ThreadWorld(n, threads=, timeout=), comm.set_timeout)")
            self._rank, self._ranks = make(comm), None
        else:
            self._rank, self._ranks = None, _ThreadRanks(mesh.ranks, make, threads, timeout)

    def _call(self, job: Callable[[Any], Any]) -> Any:
        return job(self._rank) if self._ranks is None else self._ranks.call(job)

    def close(self) -> None:
        """Stops the ranks' threads (threads only; a comm's model lives as long as its comm)."""
        if getattr(self, "_ranks", None) is not None:
            self._ranks.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _is_torch(x) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _numpy(name: str, x, dtype) -> np.ndarray:
    """x (torch CPU tensor, NumPy array or list of numbers) as a C-contiguous NumPy array of
    dtype; text, objects, complex numbers and ragged lists are refused naming `name`."""
    if _is_torch(x):
        if x.device.type != "cpu":
            raise ValueError(f"{name}: seqpar computes on the CPU; got a tensor on {x.device}")
        x = x.detach().cpu()
        if x.dtype == _torch().bfloat16:
            x = x.float()  # (NumPy has no bfloat16)
        if x.is_complex():
            raise ValueError(f"{name} holds {x.dtype} values; expected real numbers")
        x = x.numpy()
    try:
        a = np.asarray(x)
    except (TypeError, ValueError):  # a ragged list
        a = None
    if a is None or a.dtype.kind not in "biuf":
        kind = "O" if a is None else a.dtype.kind
        what = ("is not an array of numbers" if kind == "O" else "holds text" if kind in "US"
                else f"holds {a.dtype} values")
        raise ValueError(f"{name} {_brief(x)} {what}; expected real numbers (a torch tensor, "
                         "NumPy array or list of them)")
    with np.errstate(over="ignore"):  # beyond float32's range: inf, refused below
        out = np.ascontiguousarray(a, dtype=dtype)
    if out.dtype.kind == "f" and not np.isfinite(out).all():
        # Refused here, alike for every rank, rather than stopping the ranks where a layer's
        # output turns non-finite.
        at = np.unravel_index(int(np.flatnonzero(~np.isfinite(out))[0]), out.shape)
        where = f" at index {[int(i) for i in at]}" if a.ndim else ""
        raise ValueError(f"{name} holds {a.reshape(out.shape)[at]}{where}; expected finite "
                         f"{out.dtype} numbers")
    return out


def _number(name: str, value, valid: str) -> float:
    """A number keyword as a float, converted in the caller's thread: a Python or NumPy number
    or a 0-d tensor or array of one; bools, text, None and lists are refused naming `valid`
    (the values' range is the library's to check)."""
    torch = _torch()
    if _is_torch(value):
        if value.dim() == 0 and value.dtype != torch.bool and not value.is_complex():
            return float(value.item())
    elif isinstance(value, (np.ndarray, np.generic)):
        if value.ndim == 0 and value.dtype.kind in "iuf":
            return float(value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an int beyond float's range: refused by the range check
            return float("inf") if value > 0 else float("-inf")
    raise ValueError(f"{name} {_brief(value)} is not a number; valid: {valid}")


def _count(name: str, value, high: int) -> int:
    """An integer keyword in 1..high; bools, floats (not truncated) and text are refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} {_brief(value)} is not an integer; valid: 1 to {high}")
    if not 1 <= value <= high:
        raise ValueError(f"{name} {_brief(value)} is out of range; valid: 1 to {high}")
    return int(value)


def _name_keyword(where: str, name: str, value) -> str:
    """A keyword whose value is a name (weights_dtype, activations): a str, else TypeError naming
    where it was given; which names are valid is the library's to say."""
    if not isinstance(value, str):
        raise TypeError(f"{where}: {name} must be a str, not {type(value).__name__}")
    return value


def _directory(path) -> str:
    """from_pretrained's path: a str or os.PathLike naming a directory (a NUL in it refused, as
    open() refuses it, rather than cut there)."""
    name = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(name, str):
        raise ValueError(f"path {_brief(path)} is not a directory name; valid: a str or "
                         "os.PathLike naming a checkpoint directory")
    if "\0" in name:
        raise ValueError(f"path {_brief(name)} holds a NUL character; valid: a directory name")
    return name


def _no_options(name: str, value) -> None:
    """attention_kwargs / joint_attention_kwargs: None or an empty dict (seqpar's attention takes
    no options)."""
    if value is not None and not (isinstance(value, dict) and not value):
        raise ValueError(f"{name} {_brief(value)} is not supported (seqpar's attention takes no "
                         "options and no LoRA scale); valid: None or {}")


def _token_ids(name: str, x) -> np.ndarray:
    """x (torch CPU tensor, NumPy array or list) of integer token ids as int64; floats and bools
    are refused rather than truncated."""
    if _is_torch(x):
        if x.device.type != "cpu":
            raise ValueError(f"{name}: seqpar computes on the CPU; got a tensor on {x.device}")
        x = x.detach().cpu().numpy()
    try:
        a = np.asarray(x)
    except (TypeError, ValueError):  # a ragged list
        raise ValueError(f"{name} {_brief(x)} is not a list of token ids; expected integer "
                         "token ids, shape (P,) or (1, P)") from None
    if a.size == 0:
        return a.astype(np.int64)
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name} holds {a.dtype} values; expected integer token ids")
    if isinstance(x, (list, tuple)) and _holds_bool(x):  # NumPy reads [1, True] as [1, 1]
        raise ValueError(f"{name} holds bool values; expected integer token ids")
    return np.ascontiguousarray(a, dtype=np.int64)


def _holds_bool(items) -> bool:
    """Whether a (nested) list or tuple holds a bool."""
    return any(_holds_bool(e) if isinstance(e, (list, tuple)) else
               isinstance(e, (bool, np.bool_)) for e in items)


class CausalLM(_Model):
    """A Hugging Face causal LM directory (config.json, safetensors) of a family seqpar runs
    (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM: config.json's ``architectures`` or
    ``model_type`` says which) on a mesh: greedy decoding as ``seqpar generate`` (prefill context
    parallel, decode pass-Q over the sharded KV cache). ``family`` ("llama", "qwen2", "qwen3")
    and ``architecture`` say what was loaded."""

    @classmethod
    def from_pretrained(cls, path: str, *, mesh: Optional[ModelMesh] = None, comm=None,
                        threads: Optional[int] = None, timeout: Optional[float] = None,
                        weights_dtype: str = "checkpoint", activations: str = "fp32",
                        kv_cache_dtype: str = "fp32", **mesh_kwargs) -> "CausalLM":
        """Loads `path` on the mesh (``mesh=ModelMesh(...)`` or its fields as keywords: tp,
        ring_degree, ulysses_degree, strategy, layout, ulysses_mode, pad). Without comm the ranks
        are threads of this process (threads: kernel threads per rank, timeout: seconds a
        communication wait may take); with comm (its size the mesh's ranks) this is the rank's
        model, and every rank calls this and generate alike. weights_dtype: "checkpoint" (the
        matrices as stored), "int8" (quantized at load to llama.cpp's Q8_0, as ``seqpar
        generate --weights-dtype int8``) or "int8-channel" (int8 with one float32 scale per
        output row, as ``--weights-dtype int8-channel``). activations: "fp32" (the linear
        layers' inputs as computed), "bf16" (rounded to bf16 first; with bf16 weights oneDNN's
        bf16 matmul where the CPU has AVX512-BF16 or AMX, as ``seqpar generate --activations
        bf16``) or "int8" (with int8 weights only, as ``--activations int8``: with "int8-channel"
        quantized to int8 per row and multiplied by oneDNN's int8 matmul; with "int8" quantized
        per block of 32, as llama.cpp multiplies Q8_0, and multiplied in int8 with AVX512-VNNI).
        kv_cache_dtype: "fp32" (the K/V cache as computed), "bf16" or "fp16" (rounded as it is
        stored: half the memory and half the bytes a decoded token reads; the queries over it
        rounded too, the products in float32; as ``seqpar generate --kv-cache-dtype``)."""
        self = cls.__new__(cls)
        mesh = _mesh_of(mesh, mesh_kwargs, CausalLM.from_pretrained)
        spec = _mesh_dict(mesh)
        for name, value in (("weights_dtype", weights_dtype), ("activations", activations),
                            ("kv_cache_dtype", kv_cache_dtype)):
            _name_keyword("CausalLM.from_pretrained", name, value)
        self.path = where = _directory(path)  # the ranks' closures hold no reference to self
        self.weights_dtype, self.activations = weights_dtype, activations
        self.kv_cache_dtype = kv_cache_dtype
        self._start(lambda c: _core._CausalLMRank(c, where, spec, weights_dtype, activations,
                                                  kv_cache_dtype),
                    comm, mesh, threads, timeout)
        info = self._call(lambda m: (m.vocab_size, m.eos_token_ids, m.max_position_embeddings,
                                     m.family, m.architecture))
        (self.vocab_size, self.eos_token_ids, self.max_position_embeddings, self.family,
         self.architecture) = info
        return self

    def generate(self, input_ids, max_new_tokens: int = 16, *, return_logits: bool = False,
                 ignore_eos: bool = False, allow_long_context: bool = False):
        """Greedy decoding after the prompt `input_ids` (a list, or a tensor/array of shape (P,)
        or (1, P)) of up to max_new_tokens tokens, stopping after eos_token_id unless
        ignore_eos.

        Returns the new tokens (N,) int64 (the prompt not included, unlike transformers'
        generate), a torch tensor when input_ids is one, else a NumPy array; with return_logits
        also the logits (N, vocab_size) float32 of the step that chose each token.
        """
        ids = _token_ids("input_ids", input_ids)
        if ids.ndim == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.ndim != 1:
            raise ValueError(f"input_ids: expected shape (P,) or (1, P) (one prompt; several "
                             f"prompts prefill together with prefill_documents, without "
                             f"decoding), got {tuple(ids.shape)}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)):
            raise ValueError(f"max_new_tokens {_brief(max_new_tokens)} is invalid; expected an "
                             "integer")
        prompt = ids.tolist()
        n = int(max_new_tokens)
        if not -2**63 <= n < 2**63:  # the library checks the range of the others
            raise ValueError(f"max_new_tokens {_brief(n)} is out of range")
        ignore, allow = _flag("ignore_eos", ignore_eos), _flag("allow_long_context",
                                                               allow_long_context)
        return_logits = _flag("return_logits", return_logits)
        tokens, logits, _ = self._call(
            lambda m: m.generate(prompt, n, ignore, allow))
        tokens = np.asarray(tokens, dtype=np.int64)
        logits = np.frombuffer(logits, dtype=np.float32).reshape(len(tokens), self.vocab_size)
        if _is_torch(input_ids):
            torch = _torch()
            tokens, logits = torch.from_numpy(tokens), torch.from_numpy(logits.copy())
        return (tokens, logits) if return_logits else tokens

    def kv_cache_bytes_per_rank(self) -> list:
        """The bytes of storage each rank's K/V caches hold now, by world rank (as ``seqpar
        generate --json``'s kv_cache_bytes_per_rank): each layer's keys and values at
        kv_cache_dtype, for the tokens the rank keeps of the last generate (0 before the
        first). With comm every rank calls it alike."""
        return list(self._call(lambda m: m.kv_cache_bytes_per_rank()))

    def prefill_documents(self, prompts, *, return_all_logits: bool = False,
                          allow_long_context: bool = False):
        """Packed documents: the prompts (a list of token id lists, arrays or tensors of shape
        (P,) or (1, P), or a 2-D array / tensor of one prompt a row) packed one after another
        into one sequence and prefilled in one context-parallel forward pass on the mesh, as
        transformers runs each prompt alone: each attends only itself (causal inside it) and its
        RoPE positions restart at 0. The mesh's strategy shards the packed sequence (every one that
        takes documents: ring, allgather, ulysses, usp; not schedule "steal"), its layout splits
        each document on its own (zigzag, striped; contiguous runs over the packed sequence).
        Nothing is decoded after it: no cache is kept.

        Returns (tokens, logits): tokens (D,) int64, each prompt's greedy next token, and logits
        (D, vocab_size) float32, each prompt's last row; with return_all_logits also a list of D
        arrays (P_i, vocab_size) float32, every row of each prompt. Torch tensors when the first
        prompt is one, else NumPy arrays. Each prompt may be at most max_position_embeddings long
        unless allow_long_context.
        """
        rows, torch_out = _prompt_list(prompts)
        return_all = _flag("return_all_logits", return_all_logits)
        allow = _flag("allow_long_context", allow_long_context)
        tokens, logits, every = self._call(lambda m: m.prefill_documents(rows, return_all, allow))
        tokens = np.asarray(tokens, dtype=np.int64)
        logits = np.frombuffer(logits, dtype=np.float32).reshape(len(rows), self.vocab_size)
        result = [tokens, logits.copy()]
        if return_all:
            flat = np.frombuffer(every, dtype=np.float32).reshape(-1, self.vocab_size)
            ends = np.cumsum([len(r) for r in rows])
            result.append([a.copy() for a in np.split(flat, ends[:-1])])
        if torch_out:
            torch = _torch()
            result = [torch.from_numpy(r) if isinstance(r, np.ndarray) else
                      [torch.from_numpy(a) for a in r] for r in result]
        return tuple(result)


def _prompt_list(prompts) -> tuple:
    """prefill_documents' prompts as a list of token id lists, and whether they came as torch
    tensors; one line naming prompts (or prompts[i]) for anything else."""
    torch_in = _is_torch(prompts)
    if torch_in or isinstance(prompts, np.ndarray):
        ids = _token_ids("prompts", prompts)
        if ids.ndim != 2:
            raise ValueError(f"prompts: expected a list of token id lists or a 2-D array of one "
                             f"prompt a row, got shape {tuple(ids.shape)}")
        return [row.tolist() for row in ids], torch_in
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(f"prompts {_brief(prompts)} is not a list of prompts; expected a list "
                         "of token id lists (or arrays, tensors)")
    rows = []
    for i, p in enumerate(prompts):
        ids = _token_ids(f"prompts[{i}]", p)
        if ids.ndim == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.ndim != 1:
            raise ValueError(f"prompts[{i}]: expected shape (P,) or (1, P) (one prompt), got "
                             f"{tuple(ids.shape)}")
        rows.append(ids.tolist())
    return rows, bool(prompts) and _is_torch(prompts[0])


# The name the class had when it ran Llama directories only; it loads every family alike.
Llama = CausalLM


def _wan_arguments(x, t, text, neg, image=None) -> tuple:
    """The rank model's arguments: the arrays (borrowed for the call) by address and shape, the
    timesteps as a list."""
    def address(a):
        return (0, []) if a is None else (a.__array_interface__["data"][0], list(a.shape))

    (xa, xs), (ta, ts), (na, ns), (ia, ims) = (address(x), address(text), address(neg),
                                               address(image))
    return xa, xs, [float(v) for v in t], ta, ts, na, ns, ia, ims


def _f32(result) -> np.ndarray:
    """A rank model's (bytes, shape) as a float32 array of its own."""
    data, shape = result
    return np.frombuffer(data, dtype=np.float32).reshape(shape).copy()


class WanTransformerOutput(NamedTuple):
    """forward's result with return_dict=True, as diffusers' Transformer2DModelOutput: the
    prediction as .sample, or [0]."""

    sample: Any


class _Config(dict):
    """A config read as a dict or by attribute (config["in_channels"], config.in_channels), as
    diffusers' FrozenDict."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"config has no '{name}'") from None


def _pending_class():
    """The torch.Tensor subclass of a prediction not computed yet (see WanTransformer.forward):
    a torch function that touches one first fills it in place (its fill()), then runs on plain
    tensors, so what it returns is a plain tensor."""
    global _Pending
    if _Pending is None:
        torch = _torch()

        class PendingPrediction(torch.Tensor):
            fill = None  # () -> None: computes the prediction and sets it; None once set

            def set(self, value: np.ndarray) -> None:
                with torch._C.DisableTorchFunctionSubclass():
                    self.copy_(torch.from_numpy(value))
                self.fill = None

            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                for a in torch.utils._pytree.tree_leaves((args, kwargs)):
                    if isinstance(a, cls) and a.fill is not None:
                        a.fill()
                with torch._C.DisableTorchFunctionSubclass():
                    return func(*args, **kwargs)

        _Pending = PendingPrediction
    return _Pending


_Pending = None


@dataclass
class _Waiting:
    """A one-branch call on the cfg mesh whose prediction waits for its partner."""

    latents: np.ndarray
    timestep: np.ndarray
    text: np.ndarray
    prediction: Any  # a PendingPrediction
    image: Optional[np.ndarray] = None  # encoder_hidden_states_image (image-to-video)


class WanTransformer(_Model):
    """A Wan 2.1 / 2.2 text-to-video or Wan 2.1 image-to-video transformer (diffusers'
    WanTransformer3DModel directory, a WanPipeline directory with transformer/ and
    transformer_2/, or Wan's original layout) on a mesh, as ``seqpar denoise`` runs it; also a
    drop-in for diffusers' WanTransformer3DModel in a WanPipeline (``pipe.transformer =
    WanTransformer.from_pretrained(pipe_dir + "/transformer")``): config, dtype, device,
    cache_context and its call."""

    @classmethod
    def from_pretrained(cls, path: str, *, mesh: Optional[ModelMesh] = None, comm=None,
                        boundary_ratio: Optional[float] = None, threads: Optional[int] = None,
                        timeout: Optional[float] = None, activations: str = "fp32",
                        **mesh_kwargs) -> "WanTransformer":
        """Loads `path` on the mesh (``mesh=ModelMesh(...)`` or its fields as keywords, cfg
        included). Two-expert models switch at boundary_ratio x 1000 (default: the
        checkpoint's). Threads or comm, and activations ("fp32" or "bf16": every linear layer's
        input rounded to bf16 first, as ``seqpar denoise --activations bf16``), as in
        CausalLM.from_pretrained."""
        self = cls.__new__(cls)
        mesh = _mesh_of(mesh, mesh_kwargs, cls.from_pretrained)
        spec = _mesh_dict(mesh)
        self.path = where = _directory(path)
        if boundary_ratio is not None:  # its range, (0, 1), the library's
            boundary_ratio = _number("boundary_ratio", boundary_ratio,
                                     "a number in (0, 1), or None (the checkpoint's)")
        self.activations = _name_keyword("WanTransformer.from_pretrained", "activations",
                                         activations)
        self._start(lambda c: _core._WanTransformerRank(c, where, spec, boundary_ratio,
                                                        activations),
                    comm, mesh, threads, timeout)
        self.config = _Config(self._call(lambda m: m.config))
        self._waiting = None  # the one-branch call on the cfg mesh whose partner may come
        return self

    @property
    def dtype(self):
        """torch.float32, what forward takes and returns (WanPipeline casts its inputs to it);
        the weights stay in the checkpoint's dtype."""
        import torch

        return torch.float32

    @property
    def device(self):
        """The CPU: seqpar computes there."""
        import torch

        return torch.device("cpu")

    @contextlib.contextmanager
    def cache_context(self, name: str):
        """diffusers' cache-hook context, in which WanPipeline makes its "cond" and "uncond"
        calls; seqpar caches nothing between calls (the branches pair by their inputs)."""
        yield

    def forward(self, latents=None, timestep=None, encoder_hidden_states=None,
                negative_encoder_hidden_states=None, *, guidance_scale: float = 1.0,
                guidance_scale_2: Optional[float] = None, hidden_states=None,
                encoder_hidden_states_image=None, attention_kwargs: Optional[dict] = None,
                return_dict: Optional[bool] = None):
        """noise_pred (B, C_out, F, H, W) for latents (B, C, F, H, W) at timestep (a number, (B,),
        or diffusers' per-token (B, S) when each row holds one value; 0..1000) given
        encoder_hidden_states (B, L, text_dim); with negative_encoder_hidden_states and
        guidance_scale > 1 the guided prediction uncond + guidance_scale (cond - uncond), as
        WanPipeline combines them (guidance_scale_2 for the low-noise expert of two-expert
        models). Inputs are read as float32; the result is a torch tensor when latents is one,
        else a NumPy array.

        Called as diffusers calls WanTransformer3DModel, with the latents as hidden_states=, it
        answers as that model does: a WanTransformerOutput (.sample, [0]), or with
        return_dict=False a 1-tuple; attention_kwargs must be None or empty.
        encoder_hidden_states_image (B, 257, image_dim), the image encoder's states, is required
        by an image-to-video checkpoint (whose text states then hold 512 tokens) and refused by
        a text-to-video one. With the latents first (or
        latents=) it returns the prediction itself unless return_dict says otherwise.

        One branch on a cfg mesh of 2 (no negative states: WanPipeline's calls) returns a torch
        prediction that waits, uncomputed, for the next call: if that call has the same latents
        and timestep, both branches run at once, one on each cfg group, and this one's
        prediction fills the waiting one; if the waiting prediction is used first
        (guidance_scale <= 1: no second call), it is computed alone then."""
        diffusers_call = hidden_states is not None
        if diffusers_call and latents is not None:
            raise ValueError("give latents or hidden_states, not both")
        name, latents = ("hidden_states", hidden_states) if diffusers_call else ("latents", latents)
        for what, value in ((name, latents), ("timestep", timestep),
                            ("encoder_hidden_states", encoder_hidden_states)):
            if value is None:
                raise ValueError(f"forward needs {what}")
        _no_options("attention_kwargs", attention_kwargs)
        if return_dict is None and diffusers_call:
            return_dict = True
        if return_dict is not None:
            return_dict = _flag("return_dict", return_dict)
        guidance, guidance_2 = _guidance(guidance_scale, guidance_scale_2)
        x = _numpy(name, latents, np.float32)
        text = _numpy("encoder_hidden_states", encoder_hidden_states, np.float32)
        neg = (None if negative_encoder_hidden_states is None else
               _numpy("negative_encoder_hidden_states", negative_encoder_hidden_states,
                      np.float32))
        if encoder_hidden_states_image is not None and self.config["image_dim"] is None:
            raise ValueError("encoder_hidden_states_image: this checkpoint is text-to-video (no "
                             "image_dim); image conditioning is not supported for it")
        image = (None if encoder_hidden_states_image is None else
                 _numpy("encoder_hidden_states_image", encoder_hidden_states_image, np.float32))
        t = _numpy("timestep", timestep, np.float32)
        if t.ndim == 2 and t.size and (t == t[:, :1]).all():
            t = t[:, 0]  # diffusers' expand_timesteps: the timestep of every token
        t = t.reshape(-1)
        if t.size == 1 and x.ndim >= 1:
            t = np.full(x.shape[0], t[0], dtype=np.float32)
        torch_out = _is_torch(latents)
        if neg is None and self.mesh.cfg == 2 and torch_out:
            out = self._one_branch(x, t, text, image)
        else:
            out = self._velocity(x, t, text, neg, guidance, guidance_2, image)
            out = _torch().from_numpy(out) if torch_out else out
        if return_dict is None:
            return out
        return WanTransformerOutput(out) if return_dict else (out,)

    __call__ = forward

    def _one_branch(self, x, t, text, image=None):
        """The prediction for text on the cfg mesh: the waiting call's partner (both computed at
        once, the waiting one set), or a waiting prediction itself."""
        torch, w = _torch(), self._waiting
        same_image = w is not None and (
            (w.image is None and image is None) or
            (w.image is not None and image is not None and np.array_equal(w.image, image)))
        if w is not None and w.prediction.fill is not None and same_image and \
                np.array_equal(w.latents, x) and np.array_equal(w.timestep, t):
            self._waiting = None
            cond, uncond = self._branches(w.latents, w.timestep, w.text, text, w.image)
            w.prediction.set(cond)
            return torch.from_numpy(uncond)
        args = _wan_arguments(x, t, text, None, image)
        self._call(lambda m: m.check(*args))  # bad inputs refused now, not when used
        x, t, text = x.copy(), t.copy(), text.copy()  # the caller may change its tensors
        image = None if image is None else image.copy()
        pending = torch.Tensor._make_subclass(
            _pending_class(), torch.empty((x.shape[0], self.config["out_channels"], *x.shape[2:])))
        pending.fill = lambda: pending.set(self._velocity(x, t, text, None, 1.0, None, image))
        self._waiting = _Waiting(x, t, text, pending, image)
        return pending

    def _velocity(self, x, t, text, neg, guidance: float, guidance_2: Optional[float],
                  image=None):
        """guidance, guidance_2: floats (or None), as _guidance gives them."""
        args = _wan_arguments(x, t, text, neg, image)
        return _f32(self._call(lambda m: m.forward(*args, guidance, guidance_2)))

    def _branches(self, x, t, text, neg, image=None):
        """[cond, uncond] unguided; on the cfg mesh in one parallel call."""
        args = _wan_arguments(x, t, text, neg, image)
        return [_f32(v) for v in self._call(lambda m: m.branches(*args))]

    def sample(self, latents, encoder_hidden_states, negative_encoder_hidden_states=None, *,
               num_inference_steps: int = 50, guidance_scale: float = 5.0,
               guidance_scale_2: Optional[float] = None, shift: float = 5.0):
        """The latents after num_inference_steps Euler steps of diffusers'
        FlowMatchEulerDiscreteScheduler (static shift), experts switched at the boundary, as
        ``seqpar denoise --steps`` and WanPipeline's loop (float32)."""
        steps = _count("num_inference_steps", num_inference_steps, _MAX_STEPS)
        guidance, guidance_2 = _guidance(guidance_scale, guidance_scale_2)
        sigmas, timesteps = _core._flow_match_schedule(
            steps, _number("shift", shift, "a number in (0, 100]"))
        x = _numpy("latents", latents, np.float32).copy()
        text = _numpy("encoder_hidden_states", encoder_hidden_states, np.float32)
        neg = (None if negative_encoder_hidden_states is None else
               _numpy("negative_encoder_hidden_states", negative_encoder_hidden_states,
                      np.float32))
        B = x.shape[0] if x.ndim >= 1 else 1
        for i, t in enumerate(timesteps):
            v = self._velocity(x, np.full(B, t, dtype=np.float32), text, neg, guidance,
                               guidance_2)
            x += np.float32(np.float32(sigmas[i + 1]) - np.float32(sigmas[i])) * v
        return _torch().from_numpy(x) if _is_torch(latents) else x


def _guidance(scale, scale_2) -> tuple:
    """WanTransformer's guidance_scale and guidance_scale_2 (None: guidance_scale's) as floats."""
    valid = "a number 0..100"
    return (_number("guidance_scale", scale, valid),
            None if scale_2 is None else _number("guidance_scale_2", scale_2, valid + ", or None"))


def _text_lengths(name: str, mask, text: np.ndarray) -> list:
    """The valid tokens of each row of a text mask (B, L): 1s then 0s (diffusers'
    encoder_hidden_states_mask); every token when mask is None."""
    B, L = (text.shape[0], text.shape[1]) if text.ndim == 3 else (1, 0)
    if mask is None:
        return [L] * B
    m = _numpy(name, mask, np.float64)
    if m.shape != (B, L):
        raise ValueError(f"{name} has shape {tuple(m.shape)}; expected ({B}, {L})")
    lens = []
    for b in range(B):
        n = int(np.argmin(m[b] != 0)) if (m[b] == 0).any() else L
        if (m[b, n:] != 0).any():
            raise ValueError(f"{name} row {b} is not 1s then 0s (valid tokens first, then "
                             "padding)")
        lens.append(n)
    return lens


def _image_shapes(img_shapes) -> list:
    """diffusers' img_shapes as QwenImageTransformer2DModel reads it: the first batch entry, a
    (frames, height, width) or a list of them (one per image)."""
    if img_shapes is None:
        raise ValueError("forward needs img_shapes: (frames, height, width) of each image, in "
                         "patches, as QwenImagePipeline passes them")
    shapes = img_shapes[0] if isinstance(img_shapes, list) and img_shapes else img_shapes
    if not isinstance(shapes, list):
        shapes = [shapes]
    try:
        out = [tuple(_patches(v) for v in s) for s in shapes]
    except TypeError:
        out = []
    if not out or any(len(s) != 3 for s in out):
        raise ValueError(f"img_shapes {_brief(img_shapes)} is not (frames, height, width) of each "
                         "image, integers counting patches")
    return out


def _patches(v) -> int:
    """One of img_shapes' counts: an integer (or a 0-d integer tensor or array); a bool or a float
    (not truncated) raises TypeError, an integer beyond int64 ValueError."""
    if _is_torch(v):
        if v.dim() != 0 or v.is_floating_point() or v.is_complex() or v.dtype == _torch().bool:
            raise TypeError
        v = v.item()
    elif isinstance(v, np.ndarray):
        if v.ndim != 0 or v.dtype.kind not in "iu":
            raise TypeError
        v = v.item()
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError
    if not -2**63 <= v < 2**63:
        raise ValueError(f"img_shapes holds {v}, out of range; valid: counts of patches")
    return int(v)


class QwenImageTransformer(_Model):
    """A Qwen-Image transformer (diffusers' QwenImageTransformer2DModel directory, or a
    QwenImagePipeline directory with transformer/) on a mesh, as ``seqpar denoise`` runs it;
    also a drop-in for diffusers' QwenImageTransformer2DModel in a QwenImagePipeline
    (``pipe.transformer = QwenImageTransformer.from_pretrained(pipe_dir)``): config, dtype,
    device, cache_context and its call."""

    @classmethod
    def from_pretrained(cls, path: str, *, mesh: Optional[ModelMesh] = None, comm=None,
                        threads: Optional[int] = None, timeout: Optional[float] = None,
                        activations: str = "fp32", **mesh_kwargs) -> "QwenImageTransformer":
        """Loads `path` on the mesh (``mesh=ModelMesh(...)`` or its fields as keywords, cfg
        included). Threads or comm, and activations, as in WanTransformer.from_pretrained."""
        self = cls.__new__(cls)
        mesh = _mesh_of(mesh, mesh_kwargs, cls.from_pretrained)
        spec = _mesh_dict(mesh)
        self.path = where = _directory(path)
        self.activations = _name_keyword("QwenImageTransformer.from_pretrained", "activations",
                                         activations)
        self._start(lambda c: _core._QwenImageTransformerRank(c, where, spec, activations), comm,
                    mesh, threads, timeout)
        self.config = _Config(self._call(lambda m: m.config))
        self._waiting = None  # the one-branch call on the cfg mesh whose partner may come
        return self

    dtype = WanTransformer.dtype
    device = WanTransformer.device
    cache_context = WanTransformer.cache_context

    def forward(self, hidden_states=None, encoder_hidden_states=None,
                encoder_hidden_states_mask=None, timestep=None, img_shapes=None,
                txt_seq_lens=None, guidance=None, attention_kwargs: Optional[dict] = None,
                return_dict: bool = True, *, negative_encoder_hidden_states=None,
                negative_encoder_hidden_states_mask=None, true_cfg_scale: float = 1.0):
        """The noise prediction (B, S, p·p·out_channels) of packed latents hidden_states
        (B, S, in_channels) at timestep (a number or (B,), in [0, 1]: the pipeline's t / 1000),
        given encoder_hidden_states (B, L, joint_attention_dim) whose mask (B, L) marks each
        row's valid tokens (1s then 0s; padding is masked, so a row gives what it gives alone),
        for the images img_shapes; as diffusers' QwenImageTransformer2DModel answers: a
        WanTransformerOutput (.sample, [0]) or with return_dict=False a 1-tuple, a torch tensor
        when hidden_states is one. txt_seq_lens is accepted and not needed; guidance must be
        None (the model has no guidance embedding), attention_kwargs None or empty.

        With negative_encoder_hidden_states (and its mask) and true_cfg_scale > 1: the guided
        prediction as QwenImagePipeline combines the branches (rescaled to the conditional's
        norm per token). One branch on a cfg mesh of 2 (the pipeline's calls) waits, as
        WanTransformer's does, for its partner with the same latents and timestep."""
        del txt_seq_lens  # the text's own length and mask say it
        for what, value in (("hidden_states", hidden_states), ("timestep", timestep),
                            ("encoder_hidden_states", encoder_hidden_states)):
            if value is None:
                raise ValueError(f"forward needs {what}")
        if guidance is not None:
            raise ValueError("guidance: QwenImageTransformer2DModel has no guidance embedding; "
                             "give None (true_cfg_scale guides)")
        _no_options("attention_kwargs", attention_kwargs)
        return_dict = _flag("return_dict", return_dict)
        true_cfg = _number("true_cfg_scale", true_cfg_scale, "a number 0..100")
        if negative_encoder_hidden_states is None and \
                negative_encoder_hidden_states_mask is not None:
            raise ValueError("negative_encoder_hidden_states_mask is given without "
                             "negative_encoder_hidden_states")
        x = _numpy("hidden_states", hidden_states, np.float32)
        text = _numpy("encoder_hidden_states", encoder_hidden_states, np.float32)
        lens = _text_lengths("encoder_hidden_states_mask", encoder_hidden_states_mask, text)
        neg, neg_lens = None, []
        if negative_encoder_hidden_states is not None:
            neg = _numpy("negative_encoder_hidden_states", negative_encoder_hidden_states,
                         np.float32)
            neg_lens = _text_lengths("negative_encoder_hidden_states_mask",
                                     negative_encoder_hidden_states_mask, neg)
        images = _image_shapes(img_shapes)
        t = _numpy("timestep", timestep, np.float32).reshape(-1)
        if t.size == 1 and x.ndim >= 1:
            t = np.full(x.shape[0], t[0], dtype=np.float32)
        call = (x, t, images, text, lens)
        torch_out = _is_torch(hidden_states)
        if neg is None and self.mesh.cfg == 2 and torch_out:
            out = self._one_branch(call)
        else:
            out = self._run(call, neg, neg_lens, true_cfg)[0]
            out = _torch().from_numpy(out) if torch_out else out
        return WanTransformerOutput(out) if return_dict else (out,)

    __call__ = forward

    def _run(self, call, neg, neg_lens, guidance, mode="predict") -> list:
        x, t, images, text, lens = call

        def address(a):
            return (0, []) if a is None else (a.__array_interface__["data"][0], list(a.shape))

        (xa, xs), (ta, ts), (na, ns) = address(x), address(text), address(neg)
        args = (xa, xs, [float(v) for v in t], images, ta, ts, lens, na, ns, neg_lens, guidance,
                mode)
        return [_f32(r) for r in self._call(lambda m: m.forward(*args))]

    def _one_branch(self, call):
        """The prediction for this call's text on the cfg mesh: the waiting call's partner (both
        branches at once, one per cfg group, the waiting one set), or a waiting prediction."""
        torch, w = _torch(), self._waiting
        x, t, images, text, lens = call
        if w is not None and w.prediction.fill is not None and np.array_equal(w.latents, x) \
                and np.array_equal(w.timestep, t) and w.image == images:
            self._waiting = None
            cond, uncond = self._run((w.latents, w.timestep, images, w.text, w.lens), text, lens,
                                     1.0, mode="branches")
            w.prediction.set(cond)
            return torch.from_numpy(uncond)
        self._run(call, None, [], 1.0, mode="check")  # bad inputs refused now, not when used
        x, t, text = x.copy(), t.copy(), text.copy()  # the caller may change its tensors
        pending = torch.Tensor._make_subclass(
            _pending_class(), torch.empty((x.shape[0], x.shape[1], self.config["patch_size"] ** 2
                                           * self.config["out_channels"])))
        pending.fill = lambda: pending.set(self._run((x, t, images, text, lens), None, [], 1.0)[0])
        self._waiting = _Waiting(x, t, text, pending, images)
        self._waiting.lens = lens
        return pending


def _flux_ids(name: str, ids) -> Optional[np.ndarray]:
    """RoPE ids (rows, 3) as FluxTransformer2DModel reads them: a 3-D (B, rows, 3) is taken at its
    first batch entry (diffusers' deprecated form, warned the same)."""
    if ids is None:
        return None
    a = _numpy(name, ids, np.float32)
    if a.ndim == 3:
        warnings.warn(f"Passing `{name}` 3d torch.Tensor is deprecated. Please remove the batch "
                      "dimension and pass it as a 2d torch Tensor", FutureWarning, stacklevel=3)
        a = a[0]
    if a.ndim != 2 or a.shape[1] != 3:
        raise ValueError(f"{name} has shape {tuple(a.shape)}; expected (rows, 3)")
    return a


def _per_row(name: str, value, B: int) -> Optional[np.ndarray]:
    """A number or (B,) values, one per batch row (None stays None)."""
    if value is None:
        return None
    v = _numpy(name, value, np.float32).reshape(-1)
    return np.full(B, v[0], dtype=np.float32) if v.size == 1 else v


@dataclass
class _FluxCall:
    """One FluxTransformer2DModel call as arrays: the image side, then one branch's text."""

    x: np.ndarray  # hidden_states (B, S, in_channels)
    img_ids: np.ndarray  # (S, 3)
    t: np.ndarray  # (B,)
    guidance: Optional[np.ndarray]  # (B,) or None
    text: np.ndarray  # (B, L, joint_attention_dim)
    txt_ids: Optional[np.ndarray]  # (L, 3)
    pooled: Optional[np.ndarray]  # (B, pooled_projection_dim)

    def same_image(self, o: "_FluxCall") -> bool:
        """The same latents, ids, timestep and guidance: the other branch of one step."""
        def eq(a, b):
            return (a is None and b is None) or (a is not None and b is not None and
                                                 np.array_equal(a, b))

        return (np.array_equal(self.x, o.x) and np.array_equal(self.img_ids, o.img_ids) and
                np.array_equal(self.t, o.t) and eq(self.guidance, o.guidance))

    def copy(self) -> "_FluxCall":
        return _FluxCall(*(None if a is None else a.copy() for a in
                           (self.x, self.img_ids, self.t, self.guidance, self.text, self.txt_ids,
                            self.pooled)))


class FluxTransformer(_Model):
    """A FLUX.1 transformer (diffusers' FluxTransformer2DModel directory, or a FluxPipeline
    directory with transformer/; FLUX.1-dev with its guidance embedding or FLUX.1-schnell) on a
    mesh, as ``seqpar denoise`` runs it; also a drop-in for diffusers' FluxTransformer2DModel in a
    FluxPipeline (``pipe.transformer = FluxTransformer.from_pretrained(pipe_dir)``): config,
    dtype, device, cache_context and its call."""

    @classmethod
    def from_pretrained(cls, path: str, *, mesh: Optional[ModelMesh] = None, comm=None,
                        threads: Optional[int] = None, timeout: Optional[float] = None,
                        activations: str = "fp32", **mesh_kwargs) -> "FluxTransformer":
        """Loads `path` on the mesh (``mesh=ModelMesh(...)`` or its fields as keywords, cfg
        included). Threads or comm, and activations, as in WanTransformer.from_pretrained."""
        self = cls.__new__(cls)
        mesh = _mesh_of(mesh, mesh_kwargs, cls.from_pretrained)
        spec = _mesh_dict(mesh)
        self.path = where = _directory(path)
        self.activations = _name_keyword("FluxTransformer.from_pretrained", "activations",
                                         activations)
        self._start(lambda c: _core._FluxTransformerRank(c, where, spec, activations), comm, mesh,
                    threads, timeout)
        self.config = _Config(self._call(lambda m: m.config))
        # (the one-branch call on the cfg mesh whose partner may come, its PendingPrediction)
        self._waiting: Optional[tuple] = None
        return self

    dtype = WanTransformer.dtype
    device = WanTransformer.device
    cache_context = WanTransformer.cache_context

    def forward(self, hidden_states=None, encoder_hidden_states=None, pooled_projections=None,
                timestep=None, img_ids=None, txt_ids=None, guidance=None,
                joint_attention_kwargs: Optional[dict] = None, controlnet_block_samples=None,
                controlnet_single_block_samples=None, return_dict: bool = True,
                controlnet_blocks_repeat: bool = False, *, negative_encoder_hidden_states=None,
                negative_pooled_projections=None, negative_txt_ids=None,
                true_cfg_scale: float = 1.0):
        """The noise prediction (B, S, p·p·out_channels) of packed latents hidden_states
        (B, S, in_channels) with img_ids (S, 3) at timestep (a number or (B,), in [0, 1]: the
        pipeline's t / 1000), given encoder_hidden_states (B, L, joint_attention_dim) with
        txt_ids (L, 3) and pooled_projections (B, pooled_projection_dim); guidance (a number or
        (B,): the pipeline's guidance_scale) is required by a guidance_embeds checkpoint
        (FLUX.1-dev) and refused by one without (schnell). As diffusers' FluxTransformer2DModel
        answers: a WanTransformerOutput (.sample, [0]) or with return_dict=False a 1-tuple, a
        torch tensor when hidden_states is one. 3-D img_ids / txt_ids are read at their first
        batch entry (deprecated in diffusers, warned the same); joint_attention_kwargs must be
        None or empty, the controlnet residuals None.

        With negative_encoder_hidden_states, negative_pooled_projections and negative_txt_ids and
        true_cfg_scale > 1: the guided prediction neg + true_cfg_scale (cond - neg), as
        FluxPipeline combines the branches. One branch on a cfg mesh of 2 (the pipeline's calls)
        waits, as WanTransformer's does, for its partner with the same latents, img_ids, timestep
        and guidance; used first (no true CFG: no second call), it is computed alone then, by
        both cfg groups."""
        for what, value in (("hidden_states", hidden_states), ("timestep", timestep),
                            ("encoder_hidden_states", encoder_hidden_states),
                            ("img_ids", img_ids), ("txt_ids", txt_ids)):
            if value is None:
                raise ValueError(f"forward needs {what}")
        if controlnet_block_samples is not None or controlnet_single_block_samples is not None:
            raise ValueError("controlnet_block_samples / controlnet_single_block_samples are not "
                             "supported (seqpar's FLUX adds no ControlNet residuals); give None")
        if joint_attention_kwargs is not None and not (isinstance(joint_attention_kwargs, dict)
                                                       and not joint_attention_kwargs):
            raise ValueError(f"joint_attention_kwargs {_brief(joint_attention_kwargs)} is not "
                             "supported (seqpar's attention takes no options, no LoRA scale and "
                             "no IP-Adapter); valid: None or {}")
        return_dict = _flag("return_dict", return_dict)
        _flag("controlnet_blocks_repeat", controlnet_blocks_repeat)  # (no ControlNet to repeat)
        true_cfg = _number("true_cfg_scale", true_cfg_scale, "a number 0..100")
        x = _numpy("hidden_states", hidden_states, np.float32)
        B = x.shape[0] if x.ndim >= 1 else 1
        text = _numpy("encoder_hidden_states", encoder_hidden_states, np.float32)
        pooled = (None if pooled_projections is None else
                  _numpy("pooled_projections", pooled_projections, np.float32))
        call = _FluxCall(x, _flux_ids("img_ids", img_ids), _per_row("timestep", timestep, B),
                         _per_row("guidance", guidance, B), text, _flux_ids("txt_ids", txt_ids),
                         pooled)
        neg = None
        if negative_encoder_hidden_states is not None:
            neg = _FluxCall(
                x, call.img_ids, call.t, call.guidance,
                _numpy("negative_encoder_hidden_states", negative_encoder_hidden_states,
                       np.float32),
                _flux_ids("negative_txt_ids", negative_txt_ids),
                (None if negative_pooled_projections is None else
                 _numpy("negative_pooled_projections", negative_pooled_projections, np.float32)))
        elif negative_pooled_projections is not None or negative_txt_ids is not None:
            raise ValueError("negative_pooled_projections / negative_txt_ids are given without "
                             "negative_encoder_hidden_states")
        torch_out = _is_torch(hidden_states)
        if neg is None and self.mesh.cfg == 2 and torch_out:
            out = self._one_branch(call)
        else:
            out = self._run(call, neg, true_cfg)[0]
            out = _torch().from_numpy(out) if torch_out else out
        return WanTransformerOutput(out) if return_dict else (out,)

    __call__ = forward

    def _run(self, call: _FluxCall, neg: Optional[_FluxCall], true_cfg: float,
             mode: str = "predict") -> list:
        def address(a):
            return (0, []) if a is None else (a.__array_interface__["data"][0], list(a.shape))

        def ids(a):
            return [] if a is None else [float(v) for v in a.reshape(-1)]

        def floats(a):
            return [] if a is None else [float(v) for v in a]

        if mode == "predict" and self.mesh.cfg == 2 and (neg is None or true_cfg <= 1):
            # One branch on the cfg mesh (a pending prediction used alone, a NumPy call): each cfg
            # group computes it, in the time of one.
            return self._run(call, call, 1.0, mode="branches")[:1]
        n = neg if neg is not None else _FluxCall(call.x, None, call.t, None, None, None, None)
        args = (*address(call.x), ids(call.img_ids), floats(call.t), *address(call.text),
                ids(call.txt_ids), *address(call.pooled), floats(call.guidance),
                *address(n.text), ids(n.txt_ids), *address(n.pooled), true_cfg, mode)
        return [_f32(r) for r in self._call(lambda m: m.forward(*args))]

    def _one_branch(self, call: _FluxCall):
        """The prediction for this call's text on the cfg mesh: the waiting call's partner (both
        branches at once, one per cfg group, the waiting one set), or a waiting prediction."""
        torch = _torch()
        if self._waiting is not None:
            first, prediction = self._waiting
            if prediction.fill is not None and first.same_image(call):
                self._waiting = None
                cond, neg = self._run(first, call, 1.0, mode="branches")
                prediction.set(cond)
                return torch.from_numpy(neg)
        self._run(call, None, 1.0, mode="check")  # bad inputs refused now, not when used
        call = call.copy()  # the caller may change its tensors
        c = self.config
        pending = torch.Tensor._make_subclass(
            _pending_class(), torch.empty((call.x.shape[0], call.x.shape[1],
                                           c["patch_size"] ** 2 * c["out_channels"])))
        pending.fill = lambda: pending.set(self._run(call, None, 1.0)[0])
        self._waiting = (call, pending)
        return pending
