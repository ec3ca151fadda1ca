"""seqpar generate --weights-dtype int8 (Q8_0 matrices quantized at load) and --weights-dtype
int8-channel (int8 with one float32 scale per output row) against transformers'
LlamaForCausalLM run on the same checkpoint with every matrix replaced by its dequantization,
computed here in numpy from each format's definition. Q8_0: blocks of 32 along each row,
d = max|w| / 127 in float32, q = round(w * (1 / d)) half away from zero, w' = float16(d) * q.
Per-channel: s = max|w| / 127 over the whole row in float32, q = round(w / s) half away from zero,
w' = float32(s * q). Both sides then multiply the same numbers in float32, so the tokens must
agree and the logits sit within the float32 bound of the other generate tests; a wrong block,
scale or rounding moves them by the quantization step instead (about 1e-2 here). Per-channel
runs on any tensor-parallel size (no block rule): every tp size gives the one-rank run's logits
up to float32 rounding, since a row-parallel rank's columns carry the whole row's scale."""
import os
import shutil

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from safetensors.torch import load_file as load_torch

import llama_ref as L

TOL = 2e-4  # measured: at most 3.7e-5 (float32 checkpoint, tied), 5.4e-6 (bfloat16)
NEW = 6
MATRICES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
            "embed_tokens", "lm_head")


def q8_0(w):
    """Q8_0 round trip of a float32 matrix (rows, k), k a multiple of 32."""
    blocks = w.reshape(w.shape[0], -1, 32).astype(np.float32)
    d = (np.abs(blocks).max(axis=2, keepdims=True) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    x = (blocks * inv).astype(np.float32)
    a = np.abs(x)
    q = np.sign(x) * (np.floor(a) + np.floor(2 * (a - np.floor(a))))  # half away from zero
    return (d.astype(np.float16).astype(np.float32) * q).reshape(w.shape)


def per_channel(w):
    """Per-channel int8 round trip of a float32 matrix (rows, k), any k."""
    w = w.astype(np.float32)
    s = (np.abs(w).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(s > 0, w / s, np.float32(0)).astype(np.float32)
    a = np.abs(x)
    q = np.clip(np.sign(x) * (np.floor(a) + np.floor(2 * (a - np.floor(a)))), -127, 127)
    return (s * q.astype(np.float32)).astype(np.float32)


def dequantized_copy(src, dst, round_trip=q8_0):
    """A float32 copy of checkpoint src with every matrix through round_trip (q8_0 or
    per_channel)."""
    shutil.copytree(src, dst)
    for f in os.listdir(dst):
        if not f.endswith(".safetensors"):
            continue
        path = os.path.join(dst, f)
        tensors = load_torch(path)
        out = {}
        for name, t in tensors.items():
            w = t.float().numpy()
            if w.ndim == 2 and any(m in name for m in MATRICES):
                w = round_trip(w)
            out[name] = np.ascontiguousarray(w.astype(np.float32))
        save_file(out, path, metadata={"format": "pt"})
    return dst


CHECKPOINTS = {
    "bf16_untied_sharded": dict(tied=False, dtype=torch.bfloat16, sharded=True),
    "f32_tied_single_bias": dict(tied=True, dtype=torch.float32, sharded=False,
                                 attention_bias=True, mlp_bias=True),
}


# Per-channel only (Q8_0 refuses it): hidden 72, head_dim 12, intermediate 100, so no input
# dimension, whole or per tp rank, is a multiple of 32 or of a vector's width.
ODD_DIMS = dict(tied=False, dtype=torch.bfloat16, sharded=False, hidden_size=72,
                intermediate_size=100, num_attention_heads=6, num_key_value_heads=2)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """name -> (checkpoint, its Q8_0 reference copy or None, its per-channel reference copy)."""
    root = tmp_path_factory.mktemp("llama_int8")
    out = {}
    for i, (name, kw) in enumerate({**CHECKPOINTS, "bf16_odd_dims": ODD_DIMS}.items()):
        path = L.make_checkpoint(str(root / name), seed=10 + i, **kw)
        q8 = None if name == "bf16_odd_dims" else dequantized_copy(path, str(root / (name + "_q8")))
        out[name] = (path, q8, dequantized_copy(path, str(root / (name + "_ch")), per_channel))
    return out


def check(ckpts, tmp_path, name, mesh=None, backend="threads", prompt_len=57,
          weights_dtype="int8"):
    path, q8_path, channel_path = ckpts[name]
    reference_path = q8_path if weights_dtype == "int8" else channel_path
    prompt = L.prompt_of(prompt_len, L.TINY["vocab_size"], 3)
    want_tokens, want_logits = L.reference(reference_path, prompt, NEW)
    summary, tokens, logits = L.run_generate(path, prompt, NEW, tmp_path / "out.safetensors",
                                             mesh, backend,
                                             extra=["--weights-dtype", weights_dtype])
    err = float(np.abs(logits - want_logits).max())
    print(f"{weights_dtype} {name} {mesh} {backend}: max abs logit error {err:.3g}")
    assert summary["weights_dtype"] == weights_dtype
    assert tokens == want_tokens, (mesh, tokens, want_tokens)
    assert err <= TOL, (mesh, err)
    return logits


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_one_rank(ckpts, tmp_path, name):
    check(ckpts, tmp_path, name)


@pytest.mark.parametrize("mesh", [{"tp": 2}, {"tp": 4}, {"ring-degree": 2, "layout": "zigzag"},
                                  {"tp": 2, "ring-degree": 2, "ulysses-degree": 2}],
                         ids=lambda m: "-".join(f"{k}{v}" for k, v in m.items()))
def test_meshes(ckpts, tmp_path, mesh):
    check(ckpts, tmp_path, "bf16_untied_sharded", mesh)


def test_mpi(ckpts, tmp_path):
    check(ckpts, tmp_path, "bf16_untied_sharded", {"tp": 2}, backend="mpi")


@pytest.mark.parametrize("weights_dtype", ["int8", "int8-channel"])
def test_quantization_is_visible(ckpts, tmp_path, weights_dtype):
    """The int8 runs are not the checkpoint's own: their logits differ from transformers on the
    unquantized weights by far more than the bound the tests above hold."""
    path, _, _ = ckpts["bf16_untied_sharded"]
    prompt = L.prompt_of(57, L.TINY["vocab_size"], 3)
    _, plain = L.reference(path, prompt, 1)
    _, _, logits = L.run_generate(path, prompt, 1, tmp_path / "out.safetensors",
                                  extra=["--weights-dtype", weights_dtype])
    err = float(np.abs(logits - plain).max())
    print(f"{weights_dtype} against the unquantized checkpoint: max abs logit error {err:.3g}")
    assert err > 20 * TOL


# ---- per-channel ----------------------------------------------------------------------------

# Every tp size against the one-rank per-channel run: the same int8 values and scales, the sum
# over ranks in another order. measured: at most 1.8e-5 (float32 tied, tp 2), 2.9e-6 (bf16).
TP_TOL = 5e-5


@pytest.mark.parametrize("name", [*CHECKPOINTS, "bf16_odd_dims"])
def test_channel_one_rank(ckpts, tmp_path, name):
    check(ckpts, tmp_path, name, weights_dtype="int8-channel")


@pytest.mark.parametrize("name,mesh", [
    ("bf16_untied_sharded", {"tp": 2}),
    ("bf16_untied_sharded", {"tp": 4}),
    ("bf16_untied_sharded", {"tp": 8}),  # 16 attention-output inputs per rank: no block of 32
    ("f32_tied_single_bias", {"tp": 2}),
    ("bf16_odd_dims", {"tp": 2}),
    ("bf16_untied_sharded", {"ring-degree": 2, "layout": "zigzag"}),
    ("bf16_untied_sharded", {"tp": 2, "ring-degree": 2, "ulysses-degree": 2}),
], ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}{x}" for k, x in v.items()))
def test_channel_meshes(ckpts, tmp_path, name, mesh):
    one = check(ckpts, tmp_path, name, weights_dtype="int8-channel")
    many = check(ckpts, tmp_path, name, mesh, weights_dtype="int8-channel")
    diff = float(np.abs(many - one).max())
    print(f"int8-channel {name} {mesh} against one rank: max abs logit difference {diff:.3g}")
    assert diff <= TP_TOL, (mesh, diff)


def test_channel_mpi(ckpts, tmp_path):
    check(ckpts, tmp_path, "bf16_untied_sharded", {"tp": 2}, backend="mpi",
          weights_dtype="int8-channel")


def test_channel_python(ckpts):
    """weights_dtype="int8-channel" in Python, tp 2, against the same reference."""
    from module_env import SEQPAR_PYTHONPATH  # noqa: F401  puts the built module on sys.path
    import seqpar
    path, _, channel_path = ckpts["bf16_untied_sharded"]
    prompt = L.prompt_of(57, L.TINY["vocab_size"], 3)
    want_tokens, want_logits = L.reference(channel_path, prompt, NEW)
    with seqpar.Llama.from_pretrained(path, weights_dtype="int8-channel", tp=2) as model:
        assert model.weights_dtype == "int8-channel"
        tokens, logits = model.generate(prompt, NEW, return_logits=True)
    err = float(np.abs(np.asarray(logits) - want_logits).max())
    print(f"python int8-channel tp 2: max abs logit error {err:.3g}")
    assert tokens.tolist() == want_tokens and err <= TOL
    with pytest.raises(ValueError, match=r"^CausalLM: weights_dtype 'int4' is unknown; valid: "
                       r"'checkpoint', 'int8', 'int8-channel'$"):
        seqpar.Llama.from_pretrained(path, weights_dtype="int4")


def test_refusals(ckpts, tmp_path):
    import subprocess
    path, _, _ = ckpts["bf16_untied_sharded"]
    base = [L.SEQPAR, "generate", "--model", path, "--prompt-ids", "1,2,3,4,5,6,7,8",
            "--max-new-tokens", "2"]
    r = subprocess.run(base + ["--weights-dtype", "int4"], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "seqpar: error: --weights-dtype 'int4' is unknown; valid: checkpoint, int8, int8-channel")
    # tp 8: the attention output's inputs per rank are 128 / 8 = 16, not a block of 32
    r = subprocess.run(base + ["--weights-dtype", "int8", "--tp", "8"], capture_output=True,
                       text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "seqpar: error: --weights-dtype int8 quantizes blocks of 32 inputs; the attention "
        "output's inputs per rank (num_attention_heads x head_dim / --tp) is 16 "
        f"({path}/config.json); valid: multiples of 32")
