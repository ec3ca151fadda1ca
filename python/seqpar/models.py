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

Bad arguments raise ValueError with the library's one-line message; the GIL is released while
seqpar computes.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

import numpy as np

from . import _MAX_RANKS, _brief, _core, _flag, _text, _torch


@dataclass(frozen=True)
class ModelMesh:
    """A cfg x tp x ring_degree x ulysses_degree mesh, as the CLI's mesh flags.

    strategy: "ring" or "allgather", used when ulysses_degree is 1 (ulysses_degree > 1 runs
    Ulysses, with ring_degree > 1 too USP). layout: "contiguous", "striped", "zigzag".
    cfg: 2 runs the two guidance branches of a diffusion model side by side (Wan only).
    schedule: "default" or "steal" (ring, contiguous shards); softmax: "online" or "const-max"
    (the rings). The keywords also take the vocabulary's longer names: cfg_parallel_size,
    tensor_parallel_size, sequence_parallel_size (ulysses_degree x ring_degree; alone: the
    ring degree).
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

    @property
    def ranks(self) -> int:
        return self.cfg * self.tp * self.ring_degree * self.ulysses_degree


def _mesh_of(mesh: Optional[ModelMesh], kwargs: dict) -> ModelMesh:
    if mesh is not None and kwargs:
        raise ValueError(f"give the mesh as mesh=ModelMesh(...) or as keywords, not both "
                         f"(got {', '.join(sorted(kwargs))})")
    if mesh is None:
        kwargs = dict(kwargs)
        for long, short in (("cfg_parallel_size", "cfg"), ("tensor_parallel_size", "tp")):
            if long in kwargs:
                if short in kwargs:
                    raise ValueError(f"give {short} or {long}, not both")
                kwargs[short] = kwargs.pop(long)
        if "sequence_parallel_size" in kwargs:
            sp = kwargs.pop("sequence_parallel_size")
            u = kwargs.get("ulysses_degree", 1)
            if not isinstance(sp, (int, np.integer)) or isinstance(sp, bool) or sp < 1 or \
                    not isinstance(u, (int, np.integer)) or u < 1 or sp % u:
                raise ValueError(f"sequence_parallel_size {_brief(sp)} must be a multiple of "
                                 f"ulysses_degree {_brief(u)}")
            if "ring_degree" in kwargs and kwargs["ring_degree"] * u != sp:
                raise ValueError(f"sequence_parallel_size {sp} is not ulysses_degree {u} x "
                                 f"ring_degree {kwargs['ring_degree']}")
            kwargs["ring_degree"] = int(sp) // int(u)
        try:
            mesh = ModelMesh(**kwargs)
        except TypeError as e:
            raise ValueError(f"{e}; valid: tp (tensor_parallel_size), ring_degree, "
                             "ulysses_degree, sequence_parallel_size, cfg (cfg_parallel_size), "
                             "strategy, layout, ulysses_mode, pad, schedule, softmax") from None
    if not isinstance(mesh, ModelMesh):
        raise ValueError(f"mesh: expected a seqpar.ModelMesh, got {type(mesh).__name__}")
    return mesh


def _mesh_dict(mesh: ModelMesh) -> dict:
    d = asdict(mesh)
    for k in ("tp", "ring_degree", "ulysses_degree", "cfg"):
        if not isinstance(d[k], (int, np.integer)) or isinstance(d[k], bool):
            raise ValueError(f"{k} {_brief(d[k])} is invalid; expected an integer")
        if not 1 <= d[k] <= _MAX_RANKS:
            raise ValueError(f"{k} {d[k]} is out of range; valid: 1 to {_MAX_RANKS}")
        d[k] = int(d[k])
    for k in ("strategy", "layout", "ulysses_mode", "schedule", "softmax"):
        d[k] = _text(k, d[k])
    d["pad"] = _flag("pad", d["pad"])
    _core._check_model_mesh(d)  # the library's messages, before any rank starts
    return d


class _ThreadRanks:
    """The ranks of a mesh as threads of this process that stay alive between calls: each rank
    builds its model once (make(comm)), then runs the calls it is handed (job(model)) until
    closed. A ValueError of a call (raised alike on every rank, before any communication) leaves
    the ranks serving; any other failure stops them."""

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
                except ValueError as e:
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
            first = next((e for e in errors if isinstance(e, ValueError)), errors[0])
            if not all(isinstance(e, ValueError) for e in errors):
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
    """x (torch CPU tensor, NumPy array or list) as a C-contiguous NumPy array of dtype."""
    if _is_torch(x):
        if x.device.type != "cpu":
            raise ValueError(f"{name}: seqpar computes on the CPU; got a tensor on {x.device}")
        x = x.detach().cpu()
        x = x.float() if dtype == np.float32 and x.is_floating_point() else x
        x = x.numpy()
    return np.ascontiguousarray(np.asarray(x), dtype=dtype)


def _token_ids(name: str, x) -> np.ndarray:
    """x (torch CPU tensor, NumPy array or list) of integer token ids as int64; floats and bools
    are refused rather than truncated."""
    if _is_torch(x):
        if x.device.type != "cpu":
            raise ValueError(f"{name}: seqpar computes on the CPU; got a tensor on {x.device}")
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.size == 0:
        return a.astype(np.int64)
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name} holds {a.dtype} values; expected integer token ids")
    return np.ascontiguousarray(a, dtype=np.int64)


class CausalLM(_Model):
    """A Hugging Face causal LM directory (config.json, safetensors) of a family seqpar runs
    (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM: config.json's ``architectures`` or
    ``model_type`` says which) on a mesh: greedy decoding as ``seqpar generate`` (prefill context
    parallel, decode pass-Q over the sharded KV cache). ``family`` ("llama", "qwen2", "qwen3")
    and ``architecture`` say what was loaded."""

    @classmethod
    def from_pretrained(cls, path: str, *, mesh: Optional[ModelMesh] = None, comm=None,
                        threads: Optional[int] = None, timeout: Optional[float] = None,
                        **mesh_kwargs) -> "CausalLM":
        """Loads `path` on the mesh (``mesh=ModelMesh(...)`` or its fields as keywords: tp,
        ring_degree, ulysses_degree, strategy, layout, ulysses_mode, pad). Without comm the ranks
        are threads of this process (threads: kernel threads per rank, timeout: seconds a
        communication wait may take); with comm (its size the mesh's ranks) this is the rank's
        model, and every rank calls this and generate alike."""
        self = cls.__new__(cls)
        mesh = _mesh_of(mesh, mesh_kwargs)
        spec = _mesh_dict(mesh)
        self.path = where = str(path)  # the ranks' closures hold no reference to self
        self._start(lambda c: _core._CausalLMRank(c, where, spec), comm, mesh, threads, timeout)
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
            raise ValueError(f"input_ids: expected shape (P,) or (1, P) (one prompt), got "
                             f"{tuple(ids.shape)}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)):
            raise ValueError(f"max_new_tokens {_brief(max_new_tokens)} is invalid; expected an "
                             "integer")
        prompt = ids.tolist()
        n = int(max_new_tokens)
        if not -2**63 <= n < 2**63:  # the library checks the range of the others
            raise ValueError(f"max_new_tokens {_brief(n)} is out of range")
        ignore, allow = _flag("ignore_eos", ignore_eos), _flag("allow_long_context",
                                                               allow_long_context)
        tokens, logits, _ = self._call(
            lambda m: m.generate(prompt, n, ignore, allow))
        tokens = np.asarray(tokens, dtype=np.int64)
        logits = np.frombuffer(logits, dtype=np.float32).reshape(len(tokens), self.vocab_size)
        if _is_torch(input_ids):
            torch = _torch()
            tokens, logits = torch.from_numpy(tokens), torch.from_numpy(logits.copy())
        return (tokens, logits) if return_logits else tokens


# The name the class had when it ran Llama directories only; it loads every family alike.
Llama = CausalLM


class WanTransformer(_Model):
    """A Wan 2.1 / 2.2 text-to-video transformer (diffusers' WanTransformer3DModel directory, a
    WanPipeline directory with transformer/ and transformer_2/, or Wan's original layout) on a
    mesh, as ``seqpar denoise`` runs it."""

    @classmethod
    def from_pretrained(cls, path: str, *, mesh: Optional[ModelMesh] = None, comm=None,
                        boundary_ratio: Optional[float] = None, threads: Optional[int] = None,
                        timeout: Optional[float] = None, **mesh_kwargs) -> "WanTransformer":
        """Loads `path` on the mesh (``mesh=ModelMesh(...)`` or its fields as keywords, cfg
        included). Two-expert models switch at boundary_ratio x 1000 (default: the
        checkpoint's). Threads or comm as in CausalLM.from_pretrained."""
        self = cls.__new__(cls)
        mesh = _mesh_of(mesh, mesh_kwargs)
        spec = _mesh_dict(mesh)
        self.path = where = str(path)
        self._start(lambda c: _core._WanTransformerRank(c, where, spec, boundary_ratio),
                    comm, mesh, threads, timeout)
        self.config = self._call(lambda m: m.config)
        return self

    def forward(self, latents, timestep, encoder_hidden_states,
                negative_encoder_hidden_states=None, *, guidance_scale: float = 1.0,
                guidance_scale_2: Optional[float] = None):
        """noise_pred (B, C_out, F, H, W) for latents (B, C, F, H, W) at timestep (a number or
        (B,), 0..1000) given encoder_hidden_states (B, L, text_dim); with
        negative_encoder_hidden_states and guidance_scale > 1 the guided prediction
        uncond + guidance_scale (cond - uncond), as WanPipeline combines them (guidance_scale_2
        for the low-noise expert of two-expert models). Inputs are read as float32; the result
        is a torch tensor when latents is one, else a NumPy array."""
        x = _numpy("latents", latents, np.float32)
        text = _numpy("encoder_hidden_states", encoder_hidden_states, np.float32)
        neg = (None if negative_encoder_hidden_states is None else
               _numpy("negative_encoder_hidden_states", negative_encoder_hidden_states,
                      np.float32))
        t = _numpy("timestep", timestep, np.float32).reshape(-1)
        if t.size == 1 and x.ndim >= 1:
            t = np.full(x.shape[0], t[0], dtype=np.float32)
        out = self._velocity(x, t, text, neg, guidance_scale, guidance_scale_2)
        return _torch().from_numpy(out) if _is_torch(latents) else out

    __call__ = forward

    def _velocity(self, x, t, text, neg, guidance, guidance_2):
        def address(a):
            return (0, []) if a is None else (a.__array_interface__["data"][0], list(a.shape))

        (xa, xs), (ta, ts), (na, ns) = address(x), address(text), address(neg)
        g2 = None if guidance_2 is None else float(guidance_2)
        ts_list = [float(v) for v in t]
        data, shape = self._call(lambda m: m.forward(xa, xs, ts_list, ta, ts, na, ns,
                                                     float(guidance), g2))
        return np.frombuffer(data, dtype=np.float32).reshape(shape).copy()

    def sample(self, latents, encoder_hidden_states, negative_encoder_hidden_states=None, *,
               num_inference_steps: int = 50, guidance_scale: float = 5.0,
               guidance_scale_2: Optional[float] = None, shift: float = 5.0):
        """The latents after num_inference_steps Euler steps of diffusers'
        FlowMatchEulerDiscreteScheduler (static shift), experts switched at the boundary, as
        ``seqpar denoise --steps`` and WanPipeline's loop (float32)."""
        sigmas, timesteps = _core._flow_match_schedule(int(num_inference_steps), float(shift))
        x = _numpy("latents", latents, np.float32).copy()
        text = _numpy("encoder_hidden_states", encoder_hidden_states, np.float32)
        neg = (None if negative_encoder_hidden_states is None else
               _numpy("negative_encoder_hidden_states", negative_encoder_hidden_states,
                      np.float32))
        B = x.shape[0] if x.ndim >= 1 else 1
        for i, t in enumerate(timesteps):
            v = self._velocity(x, np.full(B, t, dtype=np.float32), text, neg, guidance_scale,
                               guidance_scale_2)
            x += np.float32(np.float32(sigmas[i + 1]) - np.float32(sigmas[i])) * v
        return _torch().from_numpy(x) if _is_torch(latents) else x
