"""seqpar denoise against diffusers' WanTransformer3DModel and FlowMatchEulerDiscreteScheduler.

Tiny Wan transformers are made with diffusers (save_pretrained) and the same weights renamed to
Wan's original layout. Attention is made far from uniform (QK-norm scales of 3..6, so logits
reach tens), so a wrong 3-D RoPE split, permuted head rows or a dropped QK-norm move the output
far past the tolerance. The grid 3 x 5 x 9 = 135 tokens divides none of the meshes' ranks.

Tolerances (relative to the reference's max |value|), measured errors in docs/models.md:
  fp32 weights, one call:             1e-4
  bf16 weights vs the same weights upcast to fp32 in diffusers: 1e-4 (seqpar keeps bf16 weights
  and computes in fp32); vs diffusers computing in bf16: 0.2 (measured 0.11: diffusers' bf16
  error, not seqpar's)
  4-step guided loop (shift 3, guidance 5): 1e-3 (diffusers' fp32 loop is 3e-4 from its fp64 one)
"""

import copy
import json
import os
import subprocess

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, WanTransformer3DModel
from safetensors.torch import load_file, save_file

SEQPAR = os.environ.get("SEQPAR_BIN", "seqpar")
MPIEXEC = os.environ.get("SEQPAR_MPIEXEC", "")

HEADS, HEAD_DIM, TEXT_DIM, LAYERS = 4, 20, 16, 2  # RoPE pairs 10: frames 4, height 3, width 3
GRID_LATENT = (3, 10, 18)  # latent F, H, W: 3 x 5 x 9 patches of 1x2x2
TEXT_LEN, NEG_LEN = 7, 5

# DiT's (Wan's original) names <- diffusers' names, per block and at the top level.
BLOCK_MAP = {
    "scale_shift_table": "modulation",
    "attn1.to_q": "self_attn.q", "attn1.to_k": "self_attn.k", "attn1.to_v": "self_attn.v",
    "attn1.to_out.0": "self_attn.o", "attn1.norm_q": "self_attn.norm_q",
    "attn1.norm_k": "self_attn.norm_k",
    "attn2.to_q": "cross_attn.q", "attn2.to_k": "cross_attn.k", "attn2.to_v": "cross_attn.v",
    "attn2.to_out.0": "cross_attn.o", "attn2.norm_q": "cross_attn.norm_q",
    "attn2.norm_k": "cross_attn.norm_k",
    "norm2": "norm3", "ffn.net.0.proj": "ffn.0", "ffn.net.2": "ffn.2",
}
TOP_MAP = {
    "condition_embedder.text_embedder.linear_1": "text_embedding.0",
    "condition_embedder.text_embedder.linear_2": "text_embedding.2",
    "condition_embedder.time_embedder.linear_1": "time_embedding.0",
    "condition_embedder.time_embedder.linear_2": "time_embedding.2",
    "condition_embedder.time_proj": "time_projection.1",
    "scale_shift_table": "head.modulation", "proj_out": "head.head",
    "patch_embedding": "patch_embedding",
}


def original_name(name):
    if name.startswith("blocks."):
        i, rest = name[len("blocks."):].split(".", 1)
        for d, o in BLOCK_MAP.items():
            if rest == d or rest.startswith(d + "."):
                return f"blocks.{i}.{o}{rest[len(d):]}"
        raise KeyError(name)
    for d, o in TOP_MAP.items():
        if name == d or name.startswith(d + "."):
            return o + name[len(d):]
    raise KeyError(name)


def make_model(seed, channels=4, layers=LAYERS):
    torch.manual_seed(seed)
    m = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=HEADS, attention_head_dim=HEAD_DIM,
        in_channels=channels, out_channels=channels, text_dim=TEXT_DIM, freq_dim=32, ffn_dim=64,
        num_layers=layers, rope_max_seq_len=64).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if ".norm_q." in name or ".norm_k." in name:
                p.uniform_(3.0, 6.0)  # sharp attention
            elif name.endswith("scale_shift_table"):
                p.normal_(0.0, 0.3)
            elif ".norm2." in name:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.05)
            else:
                p.normal_(0.0, 1.0 / p.shape[1] ** 0.5 if p.ndim == 2 else 0.2)
    return m


def save_original(model, path, dtype=torch.float32):
    os.makedirs(path, exist_ok=True)
    sd = {original_name(k): v.to(dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(sd, os.path.join(path, "diffusion_pytorch_model.safetensors"))
    c = model.config
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"_class_name": "WanModel", "model_type": "t2v",
                   "dim": c.num_attention_heads * c.attention_head_dim, "ffn_dim": c.ffn_dim,
                   "freq_dim": c.freq_dim, "in_dim": c.in_channels, "out_dim": c.out_channels,
                   "num_heads": c.num_attention_heads, "num_layers": c.num_layers,
                   "text_len": 512, "text_dim": c.text_dim, "eps": 1e-6}, f)


def save_diffusers(models, path, boundary_ratio=None, dtype=torch.float32):
    os.makedirs(path, exist_ok=True)
    names = ["transformer", "transformer_2"]
    for name, m in zip(names, models):
        copy.deepcopy(m).to(dtype).save_pretrained(os.path.join(path, name))
    index = {"_class_name": "WanPipeline", "_diffusers_version": "0.35.2"}
    if boundary_ratio is not None:
        index["boundary_ratio"] = boundary_ratio
    with open(os.path.join(path, "model_index.json"), "w") as f:
        json.dump(index, f)


def make_inputs(path, channels=4, timestep=None, seed=7):
    g = torch.Generator().manual_seed(seed)
    t = {"latents": torch.randn(1, channels, *GRID_LATENT, generator=g),
         "encoder_hidden_states": torch.randn(1, TEXT_LEN, TEXT_DIM, generator=g),
         "negative_encoder_hidden_states": torch.randn(1, NEG_LEN, TEXT_DIM, generator=g)}
    if timestep is not None:
        t["timestep"] = torch.tensor([timestep], dtype=torch.float32)
    save_file(t, path)
    return t


def seqpar(args, mpi_np=0):
    cmd = [SEQPAR, "denoise", *args]
    if mpi_np:
        cmd = [MPIEXEC, "--allow-run-as-root", "--oversubscribe", "--mca",
               "btl_vader_single_copy_mechanism", "none", "-n", str(mpi_np), *cmd,
               "--backend", "mpi"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    return r


def rel_err(got, ref):
    return float((got - ref).abs().max() / ref.abs().max())


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("wan")
    m = make_model(1)
    save_diffusers([m], str(d / "diffusers"))
    save_original(m, str(d / "original"))
    inp = make_inputs(str(d / "in.safetensors"), timestep=737.0)
    with torch.no_grad():
        cond = m(hidden_states=inp["latents"], timestep=inp["timestep"],
                 encoder_hidden_states=inp["encoder_hidden_states"]).sample
        uncond = m(hidden_states=inp["latents"], timestep=inp["timestep"],
                   encoder_hidden_states=inp["negative_encoder_hidden_states"]).sample
    inp_cond = {k: v for k, v in inp.items() if k != "negative_encoder_hidden_states"}
    save_file(inp_cond, str(d / "in_cond.safetensors"))
    return {"dir": d, "model": m, "inputs": inp, "cond": cond, "guided": uncond + 5.0 * (cond - uncond)}


def run_call(work, layout, mesh, inputs="in_cond.safetensors", mpi_np=0, guidance=5.0):
    out = str(work["dir"] / f"out_{layout}_{abs(hash(tuple(mesh)))}_{mpi_np}.safetensors")
    seqpar(["--model", str(work["dir"] / layout), "--inputs", str(work["dir"] / inputs),
            "--output", out, "--guidance", str(guidance), *mesh], mpi_np)
    return load_file(out)["noise_pred"]


MESHES = [
    [],
    ["--ulysses-degree", "2"],
    ["--ulysses-degree", "2", "--ulysses-mode", "strict", "--pad"],
    ["--ring-degree", "4"],
    ["--ring-degree", "4", "--layout", "zigzag"],
    ["--ring-degree", "3", "--strategy", "allgather", "--layout", "striped"],
    ["--ring-degree", "2", "--strategy", "allgather", "--pad"],
    ["--tp", "2", "--ring-degree", "2", "--layout", "zigzag"],
    ["--tp", "2", "--ulysses-degree", "2", "--ring-degree", "2"],
    ["--ulysses-degree", "4", "--ring-degree", "2", "--layout", "striped", "--pad",
     "--ulysses-mode", "strict"],
    # The rings' const-max softmax, and ring's steal schedule (bidirectional: the plain ring).
    ["--ring-degree", "4", "--softmax", "const-max"],
    ["--ulysses-degree", "2", "--ring-degree", "2", "--softmax", "const-max", "--pad"],
    ["--ring-degree", "3", "--schedule", "steal"],
]


@pytest.mark.parametrize("layout", ["diffusers", "original"])
@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: "_".join(a.strip("-") for a in m) or "one")
def test_noise_pred_fp32(work, layout, mesh):
    got = run_call(work, layout, mesh)
    err = rel_err(got, work["cond"])
    print(f"fp32 {layout} {mesh}: rel err {err:.2e}")
    assert err <= 1e-4


@pytest.mark.parametrize("mesh", [[], ["--cfg", "2"], ["--cfg", "2", "--tp", "2", "--ulysses-degree", "2"]],
                         ids=["one", "cfg2", "cfg2_tp2_u2"])
def test_guided_call(work, mesh):
    got = run_call(work, "diffusers", mesh, inputs="in.safetensors")
    err = rel_err(got, work["guided"])
    print(f"guided {mesh}: rel err {err:.2e}")
    assert err <= 1e-4


@pytest.mark.skipif(not MPIEXEC, reason="no SEQPAR_MPIEXEC")
@pytest.mark.parametrize("mesh,np_", [(["--ulysses-degree", "2", "--ring-degree", "2"], 4),
                                      (["--cfg", "2", "--ring-degree", "2", "--layout", "zigzag"], 4),
                                      (["--tp", "2", "--ulysses-degree", "3"], 6)],
                         ids=["u2r2", "cfg2_r2", "tp2_u3"])
def test_mpi(work, mesh, np_):
    got = run_call(work, "original", mesh, inputs="in.safetensors", mpi_np=np_)
    err = rel_err(got, work["guided"])
    print(f"mpi {mesh}: rel err {err:.2e}")
    assert err <= 1e-4


def test_bf16(tmp_path):
    m = make_model(2)
    save_diffusers([m], str(tmp_path / "bf16"), dtype=torch.bfloat16)
    inp = make_inputs(str(tmp_path / "in.safetensors"), timestep=500.0)
    del inp["negative_encoder_hidden_states"]
    save_file(inp, str(tmp_path / "in.safetensors"))
    out = str(tmp_path / "out.safetensors")
    seqpar(["--model", str(tmp_path / "bf16"), "--inputs", str(tmp_path / "in.safetensors"),
            "--output", out, "--ulysses-degree", "2", "--tp", "2"])
    got = load_file(out)["noise_pred"]
    # The same bf16 values in an fp32 model (Module.to would also round its RoPE tables), and the
    # model run in bf16 as a bf16 pipeline runs it.
    stored = load_file(str(tmp_path / "bf16" / "transformer" / "diffusion_pytorch_model.safetensors"))
    up = make_model(2)
    up.load_state_dict({k: v.float() for k, v in stored.items()})
    kw = dict(hidden_states=inp["latents"], timestep=inp["timestep"],
              encoder_hidden_states=inp["encoder_hidden_states"])
    with torch.no_grad():
        ref32 = up(**kw).sample
        ref16 = up.to(torch.bfloat16)(**{k: v.to(torch.bfloat16) for k, v in kw.items()}).sample.float()
    e32, e16 = rel_err(got, ref32), rel_err(got, ref16)
    print(f"bf16 weights: vs fp32 compute {e32:.2e}, vs bf16 compute {e16:.2e}")
    assert e32 <= 1e-4
    # diffusers computing in bf16 (RoPE tables, QK-norm and softmax of logits in the tens, all in
    # bf16) lands 1.1e-1 from the fp32 result; seqpar keeps fp32 activations.
    assert e16 <= 0.2


def reference_loop(models, boundary_ratio, latents, text, negative, steps, guidance, guidance_2,
                   shift):
    sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    sched.set_timesteps(steps)
    boundary = None if boundary_ratio is None else boundary_ratio * 1000
    x = latents.clone()
    experts = []
    with torch.no_grad():
        for t in sched.timesteps:
            high = boundary is None or t >= boundary
            m, g = (models[0], guidance) if high else (models[1], guidance_2)
            experts.append(1 if high else 2)
            ts = t.expand(x.shape[0])
            cond = m(hidden_states=x, timestep=ts, encoder_hidden_states=text).sample
            uncond = m(hidden_states=x, timestep=ts, encoder_hidden_states=negative).sample
            v = uncond + g * (cond - uncond)
            x = sched.step(v, t, x, return_dict=False)[0]
    return x, experts


def test_loop_guided(work):
    inp = work["inputs"]
    ref, _ = reference_loop([work["model"]], None, inp["latents"], inp["encoder_hidden_states"],
                            inp["negative_encoder_hidden_states"], 4, 5.0, 5.0, 3.0)
    out = str(work["dir"] / "loop.safetensors")
    r = seqpar(["--model", str(work["dir"] / "diffusers"), "--inputs",
                str(work["dir"] / "in.safetensors"), "--output", out, "--steps", "4",
                "--guidance", "5", "--shift", "3", "--cfg", "2", "--ring-degree", "2",
                "--ulysses-degree", "2", "--json"])
    rep = json.loads(r.stdout)
    assert len(rep["step_seconds"]) == 4 and rep["output_tensor"] == "latents"
    assert "step 4/4" in r.stderr
    sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    sched.set_timesteps(4)
    assert np.array_equal(np.array(rep["step_timesteps"], dtype=np.float32),
                          sched.timesteps.numpy())
    # Guidance 5 over sharp attention amplifies rounding: diffusers' own fp32 loop is as far from
    # its fp64 loop as seqpar is from either.
    m64 = copy.deepcopy(work["model"]).double()
    ref64, _ = reference_loop([m64], None, *(inp[k].double() for k in (
        "latents", "encoder_hidden_states", "negative_encoder_hidden_states")), 4, 5.0, 5.0, 3.0)
    got = load_file(out)["latents"]
    err, err64, own = rel_err(got, ref), rel_err(got.double(), ref64), rel_err(ref.double(), ref64)
    print(f"4-step guided loop: rel err {err:.2e} (vs fp64 {err64:.2e}; diffusers fp32 vs fp64 "
          f"{own:.2e})")
    assert err <= 1e-3 and err64 <= 1e-3


@pytest.mark.parametrize("layout", ["diffusers", "original"])
def test_two_experts(tmp_path, layout):
    high, low = make_model(3), make_model(4)
    d = tmp_path / "a14b"
    if layout == "diffusers":
        save_diffusers([high, low], str(d), boundary_ratio=0.7)
        ratio = []
    else:  # Wan 2.2 A14B's own layout; its boundary (0.875 for t2v) given here explicitly
        save_original(high, str(d / "high_noise_model"))
        save_original(low, str(d / "low_noise_model"))
        ratio = ["--boundary-ratio", "0.7"]
    inp = make_inputs(str(tmp_path / "in.safetensors"))
    ref, experts = reference_loop([high, low], 0.7, inp["latents"], inp["encoder_hidden_states"],
                                  inp["negative_encoder_hidden_states"], 4, 4.0, 2.0, 3.0)
    assert experts == [1, 1, 2, 2]
    out = str(tmp_path / "out.safetensors")
    r = seqpar(["--model", str(d), "--inputs", str(tmp_path / "in.safetensors"), "--output", out,
                "--steps", "4", "--guidance", "4", "--guidance-2", "2", "--shift", "3",
                "--ulysses-degree", "2", "--json", *ratio])
    assert json.loads(r.stdout)["step_expert"] == experts
    err = rel_err(load_file(out)["latents"], ref)
    print(f"two experts ({layout}): rel err {err:.2e}")
    assert err <= 1e-3


def test_ti2v_48_channels(tmp_path):
    # Wan 2.2 TI2V-5B's transformer shape: 48 latent channels, 1x2x2 patches.
    m = make_model(5, channels=48, layers=1)
    save_original(m, str(tmp_path / "ti2v"))
    with open(tmp_path / "ti2v" / "config.json") as f:
        c = json.load(f)
    c["model_type"] = "ti2v"
    with open(tmp_path / "ti2v" / "config.json", "w") as f:
        json.dump(c, f)
    inp = make_inputs(str(tmp_path / "in.safetensors"), channels=48, timestep=250.0)
    out = str(tmp_path / "out.safetensors")
    seqpar(["--model", str(tmp_path / "ti2v"), "--inputs", str(tmp_path / "in.safetensors"),
            "--output", out, "--ring-degree", "2", "--tp", "2", "--guidance", "1"])
    with torch.no_grad():
        ref = m(hidden_states=inp["latents"], timestep=inp["timestep"],
                encoder_hidden_states=inp["encoder_hidden_states"]).sample
    err = rel_err(load_file(out)["noise_pred"], ref)
    print(f"ti2v 48 channels: rel err {err:.2e}")
    assert err <= 1e-4


def test_sharded_index(work, tmp_path):
    # The original weights split over two files named by diffusion_pytorch_model.safetensors.index.json.
    sd = load_file(str(work["dir"] / "original" / "diffusion_pytorch_model.safetensors"))
    d = tmp_path / "sharded"
    d.mkdir()
    names = sorted(sd)
    weight_map = {}
    for i, part in enumerate([names[: len(names) // 2], names[len(names) // 2:]]):
        f = f"diffusion_pytorch_model-0000{i + 1}-of-00002.safetensors"
        save_file({n: sd[n] for n in part}, str(d / f))
        weight_map.update({n: f for n in part})
    with open(d / "diffusion_pytorch_model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    with open(work["dir"] / "original" / "config.json") as src, open(d / "config.json", "w") as dst:
        dst.write(src.read())
    out = str(tmp_path / "out.safetensors")
    seqpar(["--model", str(d), "--inputs", str(work["dir"] / "in_cond.safetensors"), "--output",
            out, "--tp", "2", "--ring-degree", "2"])
    err = rel_err(load_file(out)["noise_pred"], work["cond"])
    print(f"sharded index: rel err {err:.2e}")
    assert err <= 1e-4


def test_batch_rows_with_their_own_timesteps(work, tmp_path):
    g = torch.Generator().manual_seed(11)
    inp = {"latents": torch.randn(2, 4, *GRID_LATENT, generator=g),
           "encoder_hidden_states": torch.randn(2, TEXT_LEN, TEXT_DIM, generator=g),
           "timestep": torch.tensor([900.0, 300.0])}
    save_file(inp, str(tmp_path / "in.safetensors"))
    out = str(tmp_path / "out.safetensors")
    seqpar(["--model", str(work["dir"] / "original"), "--inputs", str(tmp_path / "in.safetensors"),
            "--output", out, "--ulysses-degree", "2"])
    with torch.no_grad():
        ref = work["model"](hidden_states=inp["latents"], timestep=inp["timestep"],
                            encoder_hidden_states=inp["encoder_hidden_states"]).sample
    err = rel_err(load_file(out)["noise_pred"], ref)
    print(f"batch of 2, timesteps 900 and 300: rel err {err:.2e}")
    assert err <= 1e-4
