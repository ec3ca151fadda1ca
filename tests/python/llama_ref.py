"""Tiny Llama checkpoints in the exact Hugging Face layout, transformers' greedy decoding as the
reference, and seqpar generate run on them (SEQPAR_BIN, SEQPAR_MPIEXEC from the environment)."""
import json
import os
import subprocess

import numpy as np
import torch
from safetensors.numpy import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from spread import NUDGES

SEQPAR = os.environ.get("SEQPAR_BIN", "seqpar")
MPIEXEC = os.environ.get("SEQPAR_MPIEXEC", "mpiexec")
MPI_FLAGS = ["--allow-run-as-root", "--oversubscribe", "--mca", "btl_vader_single_copy_mechanism",
             "none"]

# GQA 8 heads over 2 kv heads, head_dim 16; llama3 RoPE scaling whose original context (16) is
# shorter than the prompts (40-70 tokens), so that the scaling changes every angle but the
# fastest; a vocabulary that no tp size of the tests divides evenly.
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=8,
            num_key_value_heads=2, vocab_size=381, max_position_embeddings=128,
            rms_norm_eps=1e-5, rope_theta=500000.0,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 16})


def make_checkpoint(path, *, tied, dtype, sharded, seed=0, **overrides):
    """Writes a LlamaForCausalLM with save_pretrained. Weights are scaled so that attention is far
    from uniform: q/k of std 2/sqrt(hidden) give logits q.k/sqrt(d) of std about 4; the other
    matrices 1/sqrt(fan_in), embeddings of std 1, norms around 1, biases 0.1."""
    cfg = LlamaConfig(**{**TINY, **overrides}, tie_word_embeddings=tied, eos_token_id=None,
                      bos_token_id=None, pad_token_id=None)
    return save_seeded(LlamaForCausalLM, cfg, path, dtype=dtype, sharded=sharded, seed=seed)


def save_seeded(model_class, cfg, path, *, dtype, sharded, seed, qk_norm_mean=2.5):
    """model_class(cfg) with seeded weights scaled so that attention is far from uniform (q/k of
    std 2/sqrt(hidden); per-head q_norm and k_norm, where the family has them, around
    qk_norm_mean; other matrices 1/sqrt(fan_in), embeddings of std 1, norms around 1, biases
    0.1), written by save_pretrained (safetensors; sharded in 200 KB files)."""
    torch.manual_seed(seed)
    model = model_class(cfg).float()
    hidden = cfg.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.copy_(qk_norm_mean + 0.5 * torch.randn_like(p))
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            elif "q_proj" in name or "k_proj" in name:
                p.normal_(0.0, 2.0 / hidden ** 0.5)
            else:
                p.normal_(0.0, 1.0 / p.shape[1] ** 0.5)
    model = model.to(dtype)
    model.save_pretrained(path, safe_serialization=True,
                          max_shard_size="200KB" if sharded else "10GB")
    files = sorted(os.listdir(path))
    if sharded:
        assert "model.safetensors.index.json" in files, files
    else:
        assert "model.safetensors" in files, files
    return path


# The meshes the generate tests run, up to 8 ranks: tp, ring, ulysses, usp, layouts, uneven
# shards, padding, allgather, tp beyond the kv heads.
MESHES = [
    {"tp": 2},
    {"ring-degree": 2},
    {"ulysses-degree": 2},
    {"ring-degree": 2, "ulysses-degree": 2},                        # usp
    {"ring-degree": 4, "layout": "zigzag"},
    {"ring-degree": 3, "layout": "striped"},                        # uneven shards
    {"ulysses-degree": 4, "ulysses-mode": "strict", "pad": True},   # padded
    {"ring-degree": 4, "strategy": "allgather", "pad": True},
    {"tp": 4, "ring-degree": 2, "layout": "zigzag"},                # tp > kv heads
    {"tp": 2, "ring-degree": 2, "ulysses-degree": 2, "layout": "zigzag"},  # 8 ranks
]


def prompt_of(n, vocab, seed):
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


_models = {}

# The reference attention over a 16-bit K/V cache (seqpar generate --kv-cache-dtype): rows from
# position _CACHED["from"] on (the tokens that attend the cache) see q, k and v rounded to
# _CACHED["dtype"]; the rows before (the prefill's own attention) see them as computed. Causal,
# float32 softmax, GQA by repeating the kv heads.
_CACHED = {"dtype": None, "from": 0}


def _attention_over_cache(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                          **kwargs):
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    out = sdpa(query, key, value, is_causal=True, scale=scaling)
    dtype, first = _CACHED["dtype"], _CACHED["from"]
    if dtype is not None and first < query.shape[2]:
        r = lambda t: t.to(dtype).float()  # noqa: E731 (round to nearest even)
        rounded = sdpa(r(query), r(key), r(value), is_causal=True, scale=scaling)
        out = torch.cat([out[:, :, :first], rounded[:, :, first:]], dim=2)
    return out.transpose(1, 2).contiguous(), None


def reference(path, prompt, new_tokens, eos=(), linear_input=None, kv_cache=None,
              cached_from=None):
    """transformers' LlamaForCausalLM in float32 (16-bit weights upcast): greedy tokens and the
    logits row that chose each. linear_input: a function put in front of every nn.Linear (a
    forward pre-hook on its input: a rounding or a quantization), or None. kv_cache: a torch
    dtype (torch.bfloat16, torch.float16): the K/V cache kept in it, the rows from cached_from
    (default: the prompt's length) on attending it (_attention_over_cache)."""
    attention = "sdpa"
    if kv_cache is not None:
        from transformers import AttentionInterface
        AttentionInterface.register("seqpar_kv_cache", _attention_over_cache)
        attention = "seqpar_kv_cache"
    _CACHED.update(dtype=kv_cache, **{"from": len(prompt) if cached_from is None else cached_from})
    if (path, linear_input, attention) not in _models:
        model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32,
                                                 attn_implementation=attention).eval()
        for module in model.modules():
            if linear_input is not None and isinstance(module, torch.nn.Linear):
                module.register_forward_pre_hook(lambda _m, args: (linear_input(args[0]),))
        _models[path, linear_input, attention] = model
    model = _models[path, linear_input, attention]
    ids = torch.tensor([prompt])
    tokens, logits = [], []
    with torch.no_grad():
        for _ in range(new_tokens):
            row = model(ids).logits[0, -1].double().numpy()
            t = int(row.argmax())
            tokens.append(t)
            logits.append(row)
            if t in eos:
                break
            ids = torch.cat([ids, torch.tensor([[t]])], dim=1)
    return tokens, np.stack(logits)


_nudges = {}


def _nudged(linear_input, e):
    """linear_input (or nothing) after scaling its input by 1 + e; the same function for the same
    arguments, so that reference() keeps one model for each."""
    key = (linear_input, e)
    if key not in _nudges:
        inner = linear_input or (lambda x: x)
        _nudges[key] = lambda x: inner(x * (1 + e))
    return _nudges[key]


_with_spread = {}


def reference_with_spread(path, prompt, new_tokens, linear_input=None, **kw):
    """reference()'s tokens and logits, and how far those logits move with every nn.Linear input
    scaled by 1 + e, e in spread.NUDGES, before linear_input: the largest |difference| over the
    nudges, each over the steps up to the first whose greedy token differs (spread.py says why)."""
    key = (path, tuple(prompt), new_tokens, linear_input, tuple(sorted(kw.items())))
    if key not in _with_spread:
        tokens, logits = reference(path, prompt, new_tokens, linear_input=linear_input, **kw)
        moved = 0.0
        for e in NUDGES:
            t, l = reference(path, prompt, new_tokens, linear_input=_nudged(linear_input, e),
                             **kw)
            steps = next((i + 1 for i, (a, b) in enumerate(zip(t, tokens)) if a != b),
                         min(len(t), len(tokens)))
            moved = max(moved, float(np.abs(l[:steps] - logits[:steps]).max()))
        _with_spread[key] = (tokens, logits, moved)
    return _with_spread[key]


def mesh_args(mesh):
    args = []
    for key in ("tp", "ring-degree", "ulysses-degree", "strategy", "layout", "ulysses-mode",
                "schedule", "softmax", "prefill-chunk", "chunk-strategy", "chunk-schedule",
                "hardware"):
        if key in mesh:
            args += [f"--{key}", str(mesh[key])]
    if mesh.get("pad"):
        args.append("--pad")
    return args


def ranks_of(mesh):
    return mesh.get("tp", 1) * mesh.get("ring-degree", 1) * mesh.get("ulysses-degree", 1)


def run_generate(path, prompt, new_tokens, out_file, mesh=None, backend="threads", extra=()):
    """seqpar generate --json --output out_file; returns (json, tokens, logits)."""
    mesh = mesh or {}
    cmd = [SEQPAR, "generate", "--model", str(path), "--prompt-ids", ",".join(map(str, prompt)),
           "--max-new-tokens", str(new_tokens), "--json", "--output", str(out_file),
           "--backend", backend, *mesh_args(mesh), *extra]
    if backend == "mpi":
        cmd = [MPIEXEC, *MPI_FLAGS, "-n", str(ranks_of(mesh)), *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    out = load_file(str(out_file))
    assert out["tokens"].dtype == np.int64 and out["logits"].dtype == np.float32
    assert summary["tokens"] == out["tokens"].tolist()
    return summary, out["tokens"].tolist(), out["logits"].astype(np.float64)


def make_sparse_checkpoint(path, hidden=32768, intermediate=1 << 22):
    """A one-layer Llama of bf16 weights larger than any test machine (829 GB at the defaults) in
    a sparse file: its headers are real, its data never written (reads would give zeros)."""
    import struct
    os.makedirs(path)
    heads, kv_heads, vocab = 256, 8, 16
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(dict(architectures=["LlamaForCausalLM"], model_type="llama",
                       hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=1,
                       num_attention_heads=heads, num_key_value_heads=kv_heads,
                       vocab_size=vocab, max_position_embeddings=64, rms_norm_eps=1e-5,
                       rope_theta=10000.0, tie_word_embeddings=True), f)
    p, kv = "model.layers.0.", kv_heads * (hidden // heads)
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden],
              p + "input_layernorm.weight": [hidden],
              p + "post_attention_layernorm.weight": [hidden],
              p + "self_attn.q_proj.weight": [hidden, hidden],
              p + "self_attn.k_proj.weight": [kv, hidden],
              p + "self_attn.v_proj.weight": [kv, hidden],
              p + "self_attn.o_proj.weight": [hidden, hidden],
              p + "mlp.gate_proj.weight": [intermediate, hidden],
              p + "mlp.up_proj.weight": [intermediate, hidden],
              p + "mlp.down_proj.weight": [hidden, intermediate]}
    header, off = {}, 0
    for name in sorted(shapes):
        size = 2 * int(np.prod(shapes[name]))
        header[name] = {"dtype": "BF16", "shape": shapes[name], "data_offsets": [off, off + size]}
        off += size
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        f.truncate(8 + len(h) + off)
    return path
