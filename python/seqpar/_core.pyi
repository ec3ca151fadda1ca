"""Type stubs of seqpar._core, the C++ extension under the package seqpar (whose own
__init__.py carries its types). Use the package, not this module."""

from typing import Any, Callable, Dict, List, Optional, Tuple

class CommError(RuntimeError):
    """A communication failure: a peer that failed or died, a mismatched collective."""

class CommTimeout(CommError, TimeoutError):
    """A communication wait on this rank that passed its deadline."""

class Comm:
    """A rank's communicator (ThreadWorld.run hands one to each rank; MpiComm and TorchComm make
    one)."""
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def backend(self) -> str: ...
    @property
    def last_pass(self) -> Optional[str]: ...
    def barrier(self) -> None: ...
    def abort(self, message: str) -> None: ...
    def close(self) -> None: ...
    def _last_stats(self) -> dict: ...
    def _set_timeout(self, seconds: float) -> None: ...

class _HostBuffer:
    """Memory of seqpar's (fp32 results, int64 positions) read through the buffer protocol."""
    def __buffer__(self, flags: int) -> memoryview: ...

class _Buffer:
    def __init__(self, address: int, shape: List[int]) -> None: ...

class _AttentionArgs:
    strategy: str
    layout: str
    ulysses_mode: str
    softmax: str
    schedule: str
    seq_lens: List[int]
    dtype: str
    causal: bool
    pad: bool
    ulysses_degree: int
    ring_degree: int
    text_tokens: int
    seq_len: int
    scale: float
    def __init__(self) -> None: ...

def _attention(comm: Comm, q: _Buffer, k: _Buffer, v: _Buffer, out: _Buffer,
               args: _AttentionArgs) -> Tuple[Optional[_HostBuffer], _HostBuffer]: ...
def _decode_attention(comm: Comm, q: _Buffer, k: _Buffer, v: _Buffer, out: _Buffer, pass_: str,
                      dtype: str, causal: bool, scale: float,
                      hardware: str) -> Tuple[Optional[_HostBuffer], _HostBuffer]: ...
def _run_threads(n: int, fn: Callable[[Comm], object], timeout_s: float,
                 threads: int) -> list: ...
def _mpi_comm(mpi4py_comm: object) -> Comm: ...
def _torch_comm(group: object) -> Comm: ...
def _partition_positions(seq: int, ranks: int, layout: str,
                         seq_lens: List[int]) -> List[_HostBuffer]: ...
def _mesh_rows_json(cfg: int, tp: int, ring: int, ulysses: int, ranks: int, heads: int,
                    seq: int) -> str: ...
class _PlanSpec:
    model: str
    frames: int
    height: int
    width: int
    seq: int
    heads: int
    kv_heads: int
    head_dim: int
    batch: int
    causal: bool
    text_tokens: Optional[int]
    guidance: bool
    ranks: int
    ranks_per_node: Optional[int]
    memory_limit_gb: float
    dtype: str
    cfg: int
    tp: int
    ulysses_degree: int
    ring_degree: int
    strategy: str
    layout: str
    ulysses_mode: str
    softmax: str
    pad: Optional[bool]
    cached: int
    new: int
    def __init__(self) -> None: ...

def _plan_json(spec: _PlanSpec, hardware: str, top: int, simulate: bool,
               sim_ranks: str) -> Tuple[str, str]: ...
def version() -> str: ...

# The models (src/models.cc); the package's seqpar.models wraps them.
class _CausalLMRank:
    vocab_size: int
    eos_token_ids: List[int]
    max_position_embeddings: int
    family: str
    architecture: str
    def __init__(self, comm: Comm, path: str, mesh: Dict[str, Any], weights_dtype: str,
                 activations: str, kv_cache_dtype: str) -> None: ...
    def generate(self, prompt: List[int], max_new_tokens: int, ignore_eos: bool,
                 allow_long_context: bool) -> Tuple[List[int], bytes, bool]: ...
    def prefill_documents(self, prompts: List[List[int]], all_logits: bool,
                          allow_long_context: bool) -> Tuple[List[int], bytes, Optional[bytes]]: ...
    def kv_cache_bytes_per_rank(self) -> List[int]: ...

class _WanTransformerRank:
    config: Dict[str, Any]
    def __init__(self, comm: Comm, path: str, mesh: Dict[str, Any],
                 boundary_ratio: Optional[float], activations: str) -> None: ...
    def forward(self, latents: int, latents_shape: List[int], timesteps: List[float], text: int,
                text_shape: List[int], negative: int, negative_shape: List[int], guidance: float,
                guidance_2: Optional[float]) -> Tuple[bytes, List[int]]: ...
    def branches(self, latents: int, latents_shape: List[int], timesteps: List[float], text: int,
                 text_shape: List[int], negative: int, negative_shape: List[int]
                 ) -> Tuple[Tuple[bytes, List[int]], Tuple[bytes, List[int]]]: ...
    def check(self, latents: int, latents_shape: List[int], timesteps: List[float], text: int,
              text_shape: List[int], negative: int, negative_shape: List[int]) -> None: ...

def _check_model_mesh(mesh: Dict[str, Any]) -> None: ...
def _resolve_degrees(cfg: Optional[int], tp: Optional[int], ring: Optional[int],
                     ulysses: Optional[int], sp: Optional[int]) -> Tuple[int, int, int, int]: ...
def _flow_match_schedule(steps: int, shift: float) -> Tuple[List[float], List[float]]: ...
