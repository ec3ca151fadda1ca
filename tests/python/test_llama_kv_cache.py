"""seqpar generate --kv-cache-dtype bf16|fp16 against transformers' LlamaForCausalLM whose attention
keeps the same cache: every token that attends the cache (each decoded token, each chunk after the
first) sees its query and every cached key and value rounded to the cache's dtype; the prefill's
own attention sees them as computed (llama_ref._attention_over_cache). The same greedy tokens and
logits on one rank and on meshes, threads and MPI; the fp32 cache is the other tests'."""
import numpy as np
import pytest
import torch

import llama_ref as L
from spread import tolerance

NEW = 6
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Max abs logit error against the reference, per cache dtype. Decoded tokens multiply the rounded
# values in fp32 as the reference does; what is left is the fp32 summation order, which can move a
# value across a rounding boundary of the cache's dtype: one unit in the last place of a bf16 (2^-8)
# or fp16 (2^-11) key. Measured (2-core Zen 4, this suite): 2.7e-6 to 9.8e-5 where no value crossed,
# 2.1e-3 (bf16) and 8.5e-4 (fp16) where one did; which value crosses depends on the CPU's kernels
# (one crossing gave 1.2e-2 with seqpar's and oneDNN's kernels capped at AVX2), so the bound is the
# larger of TOL and the reference's own spread (spread.py). Chunks after the first attend the cache
# with more than 4 query rows per kv head: bf16 then takes oneDNN's bf16 matmul where the CPU has
# one (AVX512-BF16, AMX), which rounds P to bf16 before P.V (measured 0.054), fp16 the converted
# path with the degree-3 exp2 polynomial (measured 5.4e-3).
TOL = {"bf16": 5e-3, "fp16": 2e-3}
TOL_CHUNKS = {"bf16": 0.1, "fp16": 1.5e-2}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama_kv")
    return {"f32": L.make_checkpoint(str(root / "f32"), tied=False, dtype=torch.float32,
                                     sharded=False, seed=3),
            "bf16": L.make_checkpoint(str(root / "bf16"), tied=True, dtype=torch.bfloat16,
                                      sharded=True, seed=4)}


def check(ckpts, tmp_path, name, kv, prompt_len, mesh=None, backend="threads", tol=None,
          cached_from=None):
    path = ckpts[name]
    prompt = L.prompt_of(prompt_len, L.TINY["vocab_size"], prompt_len)
    want_tokens, want_logits, spread = L.reference_with_spread(path, prompt, NEW,
                                                               kv_cache=DTYPES[kv],
                                                               cached_from=cached_from)
    summary, tokens, logits = L.run_generate(path, prompt, NEW, tmp_path / "out.safetensors",
                                             mesh, backend, extra=("--kv-cache-dtype", kv))
    err = float(np.abs(logits - want_logits).max())
    bound = tolerance((tol or TOL)[kv], spread)
    print(f"{name} {kv} P={prompt_len} {mesh} {backend}: max abs logit error {err:.3g} "
          f"(bound {bound:.3g})")
    assert tokens == want_tokens, (mesh, tokens, want_tokens)
    assert err <= bound, (mesh, err, bound)
    assert summary["kv_cache_dtype"] == kv
    check_storage(summary["kv_cache_bytes_per_rank"], prompt_len, (mesh or {}).get("tp", 1),
                  L.ranks_of(mesh or {}))
    return logits, err


def check_storage(held, prompt_len, tp, ranks):
    """The caches' storage per rank (kv_cache_bytes_per_rank): every position fed (the prompt,
    the tokens fed back) once, in 16 bits, on each tp rank for its kv heads; each layer's K and V
    rounded up to 64 bytes."""
    layers = L.TINY["num_hidden_layers"]
    head_dim = L.TINY["hidden_size"] // L.TINY["num_attention_heads"]
    kv_heads = max(1, L.TINY["num_key_value_heads"] // tp)
    ideal = tp * (prompt_len + NEW - 1) * 2 * layers * kv_heads * head_dim * 2
    assert len(held) == ranks
    assert ideal <= sum(held) <= ideal + 2 * layers * 64 * len(held), (held, ideal)


@pytest.mark.parametrize("kv", list(DTYPES))
@pytest.mark.parametrize("name", ["f32", "bf16"])
def test_one_rank(ckpts, tmp_path, name, kv):
    logits, err = check(ckpts, tmp_path, name, kv, 45)
    # The first token comes from the prefill, before any cache is read. After it the cache is
    # rounded: the rounded reference explains the logits 10x better than transformers' float32
    # cache (measured 36x or more).
    prompt = L.prompt_of(45, L.TINY["vocab_size"], 45)
    _, fp32_cache = L.reference(ckpts[name], prompt, NEW)
    assert float(np.abs(logits[0] - fp32_cache[0]).max()) <= TOL[kv]
    moved = float(np.abs(logits[1:] - fp32_cache[1:]).max())
    print(f"  against a float32 cache: {moved:.3g}")
    assert moved > 10 * err, (moved, err)


MESHES = [
    {"tp": 2},
    {"ring-degree": 2},
    {"ring-degree": 3, "layout": "zigzag"},
    {"ulysses-degree": 2},
    {"ring-degree": 2, "ulysses-degree": 2},
    {"tp": 4, "ring-degree": 2},  # tp beyond the kv heads
]


@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: "-".join(f"{k}{v}" for k, v in m.items()))
@pytest.mark.parametrize("kv", list(DTYPES))
def test_meshes(ckpts, tmp_path, kv, mesh):
    check(ckpts, tmp_path, "bf16", kv, 50, mesh)


@pytest.mark.parametrize("kv", list(DTYPES))
def test_mpi(ckpts, tmp_path, kv):
    check(ckpts, tmp_path, "f32", kv, 40, {"ring-degree": 2, "tp": 2}, backend="mpi")


CHUNKED = [
    {"ring-degree": 2, "prefill-chunk": 16, "chunk-strategy": "passkv"},
    {"ring-degree": 3, "prefill-chunk": 9, "chunk-strategy": "passq"},
    {"prefill-chunk": 20, "chunk-strategy": "passq"},
]


@pytest.mark.parametrize("mesh", CHUNKED, ids=lambda m: "-".join(f"{k}{v}" for k, v in m.items()))
@pytest.mark.parametrize("kv", list(DTYPES))
def test_chunked_prefill(ckpts, tmp_path, kv, mesh):
    """Chunks after the first attend the cache: from the first chunk's end on, the reference
    rounds too."""
    sp = mesh.get("ring-degree", 1)
    first = max(mesh["prefill-chunk"], sp)
    check(ckpts, tmp_path, "bf16", kv, 47, mesh, tol=TOL_CHUNKS, cached_from=first)


@pytest.mark.parametrize("mesh", [{"ring_degree": 2}, {"tp": 2, "ring_degree": 2}],
                         ids=lambda m: "-".join(f"{k}{v}" for k, v in m.items()))
@pytest.mark.parametrize("kv", list(DTYPES))
def test_python_keyword(ckpts, kv, mesh):
    from module_env import SEQPAR_PYTHONPATH  # noqa: F401  (puts the built module on sys.path)
    import seqpar
    path = ckpts["f32"]
    prompt = L.prompt_of(41, L.TINY["vocab_size"], 41)
    want_tokens, want_logits, spread = L.reference_with_spread(path, prompt, NEW,
                                                               kv_cache=DTYPES[kv])
    ranks = mesh.get("tp", 1) * mesh["ring_degree"]
    with seqpar.CausalLM.from_pretrained(path, kv_cache_dtype=kv, **mesh) as model:
        assert model.kv_cache_dtype == kv
        assert model.kv_cache_bytes_per_rank() == [0] * ranks
        tokens, logits = model.generate(prompt, max_new_tokens=NEW, return_logits=True)
        check_storage(model.kv_cache_bytes_per_rank(), 41, mesh.get("tp", 1), ranks)
    assert tokens.tolist() == want_tokens
    assert float(np.abs(logits - want_logits).max()) <= tolerance(TOL[kv], spread)
    with pytest.raises(ValueError, match=r"^CausalLM: kv_cache_dtype 'fp8' is unknown; valid: "
                                         r"'fp32', 'bf16', 'fp16'$"):
        seqpar.CausalLM.from_pretrained(path, kv_cache_dtype="fp8")
    with pytest.raises(TypeError, match="kv_cache_dtype must be a str"):
        seqpar.CausalLM.from_pretrained(path, kv_cache_dtype=16)


def test_refused(ckpts, tmp_path):
    import subprocess
    r = subprocess.run([L.SEQPAR, "generate", "--model", ckpts["f32"], "--prompt-ids", "1,2,3",
                        "--kv-cache-dtype", "fp8"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "seqpar: error: --kv-cache-dtype 'fp8' is unknown; valid: fp32, bf16, fp16"], r.stderr
    r = subprocess.run([L.SEQPAR, "generate", "--model", ckpts["f32"], "--document-ids", "1,2",
                        "--document-ids", "3", "--kv-cache-dtype", "bf16"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "seqpar: error: --kv-cache-dtype bf16 with --document-ids: a packed prefill keeps no "
        "cache; leave it out"], r.stderr
