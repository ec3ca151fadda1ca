"""seqpar generate --weights-dtype int8 (Q8_0 matrices quantized at load) against transformers'
LlamaForCausalLM run on the same checkpoint with every matrix replaced by its Q8_0
dequantization, computed here in numpy from the format's definition (blocks of 32 along each
row: d = max|w| / 127 in float32, q = round(w * (1 / d)) half away from zero, w' = float16(d) * q).
Both sides then multiply the same numbers in float32, so the tokens must agree and the logits sit
within the float32 bound of the other generate tests; a wrong block, scale or rounding moves them
by the quantization step instead (about 1e-2 here)."""
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


def dequantized_copy(src, dst):
    """A float32 copy of checkpoint src with every matrix through q8_0."""
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
                w = q8_0(w)
            out[name] = np.ascontiguousarray(w.astype(np.float32))
        save_file(out, path, metadata={"format": "pt"})
    return dst


CHECKPOINTS = {
    "bf16_untied_sharded": dict(tied=False, dtype=torch.bfloat16, sharded=True),
    "f32_tied_single_bias": dict(tied=True, dtype=torch.float32, sharded=False,
                                 attention_bias=True, mlp_bias=True),
}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama_int8")
    out = {}
    for i, (name, kw) in enumerate(CHECKPOINTS.items()):
        path = L.make_checkpoint(str(root / name), seed=10 + i, **kw)
        out[name] = (path, dequantized_copy(path, str(root / (name + "_q8"))))
    return out


def check(ckpts, tmp_path, name, mesh=None, backend="threads", prompt_len=57):
    path, reference_path = ckpts[name]
    prompt = L.prompt_of(prompt_len, L.TINY["vocab_size"], 3)
    want_tokens, want_logits = L.reference(reference_path, prompt, NEW)
    summary, tokens, logits = L.run_generate(path, prompt, NEW, tmp_path / "out.safetensors",
                                             mesh, backend, extra=["--weights-dtype", "int8"])
    err = float(np.abs(logits - want_logits).max())
    print(f"{name} {mesh} {backend}: max abs logit error {err:.3g}")
    assert summary["weights_dtype"] == "int8"
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


def test_quantization_is_visible(ckpts, tmp_path):
    """The int8 run is not the checkpoint's own: its logits differ from transformers on the
    unquantized weights by far more than the bound the tests above hold."""
    path, _ = ckpts["bf16_untied_sharded"]
    prompt = L.prompt_of(57, L.TINY["vocab_size"], 3)
    _, plain = L.reference(path, prompt, 1)
    _, _, logits = L.run_generate(path, prompt, 1, tmp_path / "out.safetensors",
                                  extra=["--weights-dtype", "int8"])
    err = float(np.abs(logits - plain).max())
    print(f"int8 against the unquantized checkpoint: max abs logit error {err:.3g}")
    assert err > 20 * TOL


def test_refusals(ckpts, tmp_path):
    import subprocess
    path, _ = ckpts["bf16_untied_sharded"]
    base = [L.SEQPAR, "generate", "--model", path, "--prompt-ids", "1,2,3,4,5,6,7,8",
            "--max-new-tokens", "2"]
    r = subprocess.run(base + ["--weights-dtype", "int4"], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "seqpar: error: --weights-dtype 'int4' is unknown; valid: checkpoint, int8")
    # tp 8: the attention output's inputs per rank are 128 / 8 = 16, not a block of 32
    r = subprocess.run(base + ["--weights-dtype", "int8", "--tp", "8"], capture_output=True,
                       text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "seqpar: error: --weights-dtype int8 quantizes blocks of 32 inputs; the attention "
        "output's inputs per rank (num_attention_heads x head_dim / --tp) is 16 "
        f"({path}/config.json); valid: multiples of 32")
