"""seqpar denoise and seqpar.QwenImageTransformer against diffusers' QwenImageTransformer2DModel.

A tiny Qwen-Image transformer is made with diffusers (save_pretrained). Its attention is made far
from uniform (per-head QK-norm scales of 2..4), so a wrong RoPE (the scaled image grid, the text
positions after it), a modulation chunk out of order, a stream's weights swapped or a text key
counted twice moves the prediction far past the tolerance. Image tokens: one 5 x 7 image (35
tokens) or two images (3 x 4 and 2 x 5: 22 tokens), counts no mesh's ranks divide; 3 heads,
which no Ulysses degree but 3 divides (uaa splits them unevenly). tp 2 runs on a second
checkpoint of 4 heads, on threads and under MPI.

The oracle for a batch with text masks is diffusers called on each row alone with its valid text
tokens: diffusers 0.35 passes the mask to its attention processor without applying it, so its
batched call would let padded text keys in; seqpar masks them (as the mask means, and as later
diffusers versions do).

Tolerances (relative to the reference's max |value|; measured errors in docs/models.md):
  fp32, every mesh: 1e-5 (measured 1.5e-6 to 4.3e-6; diffusers' own fp32 run is 1.0e-6 from its
  fp64 one, and torch.exp rounds two of the 128 timestep frequencies one fp32 step away from the
  correctly rounded ones seqpar uses)
  bf16 weights vs the same weights upcast in diffusers: 1e-5 (measured 3.0e-6; both compute in
  fp32 on the same values, so the fp32 bound)
  guided (true CFG, rescaled): 2e-5 (measured 7.8e-6 to 8.4e-6)
The 4-head checkpoint's q rows of heads 0-1 and 2-3 swapped in block 1 were seen to fail tp 2
(4.4e-1).
"""

import json
import os
import subprocess

import numpy as np
import pytest
import torch
from diffusers import QwenImageTransformer2DModel
from module_env import SEQPAR_PYTHONPATH  # noqa: F401  puts the built module on sys.path
from safetensors.torch import load_file, save_file

SEQPAR = os.environ.get("SEQPAR_BIN", "seqpar")
MPIEXEC = os.environ.get("SEQPAR_MPIEXEC", "")

HEADS, HEAD_DIM, TEXT_DIM, CHANNELS, OUT = 3, 16, 24, 16, 4
ONE_IMAGE = [(1, 5, 7)]
TWO_IMAGES = [(1, 3, 4), (1, 2, 5)]
TEXT_LEN, NEG_LEN = 7, 5
TEXT_LENS, NEG_LENS = [7, 4], [5, 3]  # valid tokens of each batch row
TIMESTEPS = [0.7, 0.35]


def make_model(seed=1, heads=HEADS):
    torch.manual_seed(seed)
    m = QwenImageTransformer2DModel(
        patch_size=2, in_channels=CHANNELS, out_channels=OUT, num_layers=2,
        attention_head_dim=HEAD_DIM, num_attention_heads=heads, joint_attention_dim=TEXT_DIM,
        axes_dims_rope=(4, 6, 6)).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if ".norm_q." in name or ".norm_k." in name or ".norm_added_" in name:
                p.uniform_(2.0, 4.0)  # sharp attention
            elif name.endswith("_mod.1.bias") or name == "norm_out.linear.bias":
                p.normal_(0.0, 0.3)  # gates and shifts far from 0
            elif name.endswith("bias"):
                p.normal_(0.0, 0.05)
            elif p.ndim == 2:
                p.normal_(0.0, 1.0 / p.shape[1] ** 0.5)
    return m


def mask(lens, length):
    return torch.tensor([[1] * n + [0] * (length - n) for n in lens], dtype=torch.int64)


def make_inputs(path, images, seed=7, batch=2):
    g = torch.Generator().manual_seed(seed)
    S = sum(f * h * w for f, h, w in images)
    t = {"hidden_states": torch.randn(batch, S, CHANNELS, generator=g),
         "encoder_hidden_states": torch.randn(batch, TEXT_LEN, TEXT_DIM, generator=g),
         "encoder_hidden_states_mask": mask(TEXT_LENS[:batch], TEXT_LEN),
         "negative_encoder_hidden_states": torch.randn(batch, NEG_LEN, TEXT_DIM, generator=g),
         "negative_encoder_hidden_states_mask": mask(NEG_LENS[:batch], NEG_LEN),
         "timestep": torch.tensor(TIMESTEPS[:batch], dtype=torch.float32),
         "img_shapes": torch.tensor(images, dtype=torch.int64)}
    save_file(t, path)
    return t


def reference(m, inp, images, text="encoder_hidden_states"):
    """diffusers on each row alone with its valid text tokens."""
    rows = []
    lens = inp[text + "_mask"].sum(dim=1).tolist()
    with torch.no_grad():
        for b, n in enumerate(lens):
            rows.append(m(hidden_states=inp["hidden_states"][b:b + 1],
                          encoder_hidden_states=inp[text][b:b + 1, :n],
                          encoder_hidden_states_mask=torch.ones(1, n, dtype=torch.int64),
                          timestep=inp["timestep"][b:b + 1], img_shapes=[images],
                          txt_seq_lens=[n], return_dict=False)[0])
    return torch.cat(rows)


def true_cfg(cond, uncond, scale):
    """QwenImagePipeline's combination of the two branches."""
    comb = uncond + scale * (cond - uncond)
    return comb * (torch.norm(cond, dim=-1, keepdim=True) / torch.norm(comb, dim=-1, keepdim=True))


def seqpar(args, mpi_np=0, check=True):
    cmd = [SEQPAR, "denoise", *args]
    if mpi_np:
        cmd = [MPIEXEC, "--allow-run-as-root", "--oversubscribe", "--mca",
               "btl_vader_single_copy_mechanism", "none", "-n", str(mpi_np), *cmd,
               "--backend", "mpi"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    return r


def rel_err(got, ref):
    return float((got - ref).abs().max() / ref.abs().max())


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen_image")
    m = make_model()
    m.save_pretrained(str(d / "transformer"))
    with open(d / "model_index.json", "w") as f:
        json.dump({"_class_name": "QwenImagePipeline", "_diffusers_version": "0.35.2"}, f)
    w = {"dir": d, "model": m}
    for name, images in (("one", ONE_IMAGE), ("two", TWO_IMAGES)):
        inp = make_inputs(str(d / f"in_{name}.safetensors"), images)
        cond_only = {k: v for k, v in inp.items() if not k.startswith("negative")}
        save_file(cond_only, str(d / f"in_{name}_cond.safetensors"))
        w[name] = {"inputs": inp, "cond": reference(m, inp, images),
                   "uncond": reference(m, inp, images, "negative_encoder_hidden_states")}
    return w


def run_call(work, inputs, mesh, mpi_np=0, guidance=4.0, model="."):
    key = abs(hash((model, inputs, tuple(mesh), mpi_np, guidance)))
    out = str(work["dir"] / f"out_{key}.safetensors")
    seqpar(["--model", str(work["dir"] / model), "--inputs", str(work["dir"] / inputs),
            "--output", out, "--guidance", str(guidance), *mesh], mpi_np)
    return load_file(out)["noise_pred"]


MESHES = [
    [],
    ["--ulysses-degree", "8", "--ulysses-mode", "uaa"],
    ["--ulysses-degree", "3", "--ulysses-mode", "strict", "--pad"],
    ["--ring-degree", "8"],
    ["--ring-degree", "4", "--layout", "zigzag", "--pad"],
    ["--ring-degree", "3", "--strategy", "allgather", "--layout", "striped"],
    ["--ulysses-degree", "2", "--ring-degree", "4"],
    ["--ring-degree", "4", "--softmax", "const-max"],
    ["--tp", "3"],
    ["--tp", "3", "--ring-degree", "2", "--layout", "zigzag"],
]


@pytest.mark.parametrize("images", ["one", "two"])
@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: "_".join(a.strip("-") for a in m) or "one")
def test_noise_pred_fp32(work, images, mesh):
    got = run_call(work, f"in_{images}_cond.safetensors", mesh)
    err = rel_err(got, work[images]["cond"])
    print(f"fp32 {images} {mesh}: rel err {err:.2e}")
    assert err < 1e-5


@pytest.mark.parametrize("mesh", [[], ["--cfg", "2", "--ulysses-degree", "2", "--ring-degree", "2"],
                                  ["--cfg", "2", "--tp", "3"]],
                         ids=["one", "cfg2_u2_r2", "cfg2_tp3"])
def test_guided(work, mesh):
    w = work["one"]
    got = run_call(work, "in_one.safetensors", mesh, guidance=4.0)
    err = rel_err(got, true_cfg(w["cond"], w["uncond"], 4.0))
    print(f"guided {mesh}: rel err {err:.2e}")
    assert err < 2e-5


def test_ring_sees_text_keys_once(work, tmp_path):
    """Text much longer than each rank's image shard: a ring that let every rank's step add the
    text keys (counted N times) would move the prediction by O(1)."""
    m, images = work["model"], [(1, 2, 3)]
    g = torch.Generator().manual_seed(3)
    inp = {"hidden_states": torch.randn(1, 6, CHANNELS, generator=g),
           "encoder_hidden_states": torch.randn(1, 40, TEXT_DIM, generator=g),
           "timestep": torch.tensor([0.5]), "img_shapes": torch.tensor(images)}
    save_file(inp, str(tmp_path / "in.safetensors"))
    inp["encoder_hidden_states_mask"] = torch.ones(1, 40, dtype=torch.int64)
    ref = reference(m, inp, images)
    for mesh in (["--ring-degree", "6"], ["--ulysses-degree", "2", "--ring-degree", "3"]):
        out = str(tmp_path / "out.safetensors")
        seqpar(["--model", str(work["dir"]), "--inputs", str(tmp_path / "in.safetensors"),
                "--output", out, *mesh])
        assert rel_err(load_file(out)["noise_pred"], ref) < 1e-5, mesh


def test_ulysses_splits_the_text_by_head(work):
    """Under Ulysses each rank reads (and projects and attends) only its heads of the text: on
    Ulysses 3 (one of the 3 heads each) every rank reads 2/3 fewer rows of add_q/k/v_proj and
    columns of to_add_out than on ring 3, where each rank computes every text head."""
    def weight_bytes(mesh):
        out = str(work["dir"] / "bytes.safetensors")
        r = seqpar(["--model", str(work["dir"]), "--inputs",
                    str(work["dir"] / "in_one_cond.safetensors"), "--output", out, "--json",
                    *mesh])
        return json.loads(r.stdout)["weight_bytes_per_rank"]

    d, dh = HEADS * HEAD_DIM, HEAD_DIM
    # Per block: q, k, v rows (weights and biases) and to_add_out columns of 2 heads of 3.
    saved = 2 * 4 * (3 * (2 * dh * d + 2 * dh) + d * 2 * dh)
    ring, ulysses = weight_bytes(["--ring-degree", "3"]), weight_bytes(["--ulysses-degree", "3"])
    assert [r - u for r, u in zip(ring, ulysses)] == [saved] * 3


@pytest.fixture(scope="module")
def work_tp2(work):
    """A checkpoint of 4 heads (tp 2 refuses the other's 3), written by diffusers, and its
    reference on the two images' batch."""
    m = make_model(3, heads=4)
    m.save_pretrained(str(work["dir"] / "heads_4"))
    return reference(m, work["two"]["inputs"], TWO_IMAGES)


@pytest.mark.parametrize("mpi_np", [0, 2], ids=["threads", "mpi"])
def test_tp2(work, work_tp2, mpi_np):
    if mpi_np and not MPIEXEC:
        pytest.skip("no mpiexec")
    got = run_call(work, "in_two_cond.safetensors", ["--tp", "2"], mpi_np, model="heads_4")
    err = rel_err(got, work_tp2)
    print(f"4 heads tp 2 ({'mpi' if mpi_np else 'threads'}): rel err {err:.2e}")
    assert err < 1e-5


def test_mpi(work):
    if not MPIEXEC:
        pytest.skip("no mpiexec")
    got = run_call(work, "in_two_cond.safetensors", ["--ulysses-degree", "2", "--ring-degree", "2"],
                   mpi_np=4)
    err = rel_err(got, work["two"]["cond"])
    print(f"mpi u2 r2: rel err {err:.2e}")
    assert err < 1e-5
    w = work["one"]
    got = run_call(work, "in_one.safetensors", ["--cfg", "2", "--ring-degree", "2"], mpi_np=4)
    err = rel_err(got, true_cfg(w["cond"], w["uncond"], 4.0))
    print(f"mpi cfg2 r2 guided: rel err {err:.2e}")
    assert err < 2e-5


def test_bf16(work, tmp_path):
    m = make_model(2).to(torch.bfloat16)
    m.save_pretrained(str(tmp_path / "bf16"))
    m32 = m.to(torch.float32)  # the same weights, upcast: what seqpar computes with
    inp = work["one"]["inputs"]
    ref = reference(m32, inp, ONE_IMAGE)
    out = str(tmp_path / "out.safetensors")
    seqpar(["--model", str(tmp_path / "bf16"), "--inputs",
            str(work["dir"] / "in_one_cond.safetensors"), "--output", out, "--ulysses-degree",
            "2"])
    err = rel_err(load_file(out)["noise_pred"], ref)
    print(f"bf16 ulysses 2: rel err {err:.2e}")
    assert err < 1e-5


def test_bad_inputs(work, tmp_path):
    inp = {k: v for k, v in work["one"]["inputs"].items() if not k.startswith("negative")}

    def refused(changes, expected, model=None):
        bad = dict(inp, **changes)
        for k in [k for k, v in bad.items() if v is None]:
            del bad[k]
        save_file(bad, str(tmp_path / "bad.safetensors"))
        r = seqpar(["--model", model or str(work["dir"]), "--inputs",
                    str(tmp_path / "bad.safetensors"), "--output", str(tmp_path / "o.safetensors")],
                   check=False)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], r.stderr
        assert not (tmp_path / "o.safetensors").exists()

    refused({"img_shapes": torch.tensor([[1, 5, 6]])}, "img_shapes give 30 image tokens")
    refused({"encoder_hidden_states_mask": torch.ones(2, 6, dtype=torch.int64)},
            "'encoder_hidden_states_mask' has shape [2, 6]; expected [2, 7]")
    refused({"encoder_hidden_states_mask": torch.tensor([[1, 0, 1, 1, 1, 1, 1]] * 2)},
            "is not 1s then 0s")
    refused({"img_shapes": None}, "tensor 'img_shapes' is missing")
    refused({"timestep": torch.tensor([700.0, 700.0])}, "expected values in [0, 1]")
    refused({"hidden_states": torch.zeros(2, 35, 8)}, "expected [B, S, 16]")
    other = tmp_path / "other"
    other.mkdir()
    with open(other / "config.json", "w") as f:
        json.dump({"_class_name": "SD3Transformer2DModel"}, f)
    refused({}, "SD3Transformer2DModel", model=str(other))
    # Checkpoints: a tensor missing, a tensor of another shape.
    weights = load_file(str(work["dir"] / "transformer" / "diffusion_pytorch_model.safetensors"))
    for name, change, expected in (
            ("missing", lambda w: w.pop("transformer_blocks.1.attn.norm_added_k.weight"),
             "tensor 'transformer_blocks.1.attn.norm_added_k.weight' is missing"),
            ("misshapen", lambda w: w.update({"txt_in.weight": torch.zeros(48, 23)}),
             "tensor 'txt_in.weight' has shape [48, 23]; expected [48, 24]")):
        ck = tmp_path / name
        ck.mkdir()
        (ck / "config.json").write_text((work["dir"] / "transformer" / "config.json").read_text())
        w = dict(weights)
        change(w)
        save_file(w, str(ck / "diffusion_pytorch_model.safetensors"))
        refused({}, expected, model=str(ck))


def test_python_module(work):
    import seqpar

    w = work["two"]
    inp = w["inputs"]
    model = seqpar.QwenImageTransformer.from_pretrained(str(work["dir"]), ulysses_degree=2)
    try:
        assert model.config.joint_attention_dim == TEXT_DIM
        out = model(hidden_states=inp["hidden_states"], timestep=inp["timestep"],
                    encoder_hidden_states=inp["encoder_hidden_states"],
                    encoder_hidden_states_mask=inp["encoder_hidden_states_mask"],
                    img_shapes=[TWO_IMAGES] * 2, txt_seq_lens=TEXT_LENS, return_dict=False)[0]
        assert isinstance(out, torch.Tensor)
        assert rel_err(out, w["cond"]) < 1e-5
    finally:
        model.close()


def test_python_pipeline_calls_on_cfg_mesh(work):
    """QwenImagePipeline's two calls (cond, then uncond) on a cfg 2 mesh: run at once, one
    branch per cfg group, then combined by the pipeline's own code."""
    import seqpar

    w = work["one"]
    inp = w["inputs"]
    model = seqpar.QwenImageTransformer.from_pretrained(str(work["dir"]), cfg=2, ring_degree=2)
    try:
        common = dict(hidden_states=inp["hidden_states"], timestep=inp["timestep"],
                      img_shapes=[ONE_IMAGE] * 2, return_dict=False)
        cond = model(encoder_hidden_states=inp["encoder_hidden_states"],
                     encoder_hidden_states_mask=inp["encoder_hidden_states_mask"], **common)[0]
        uncond = model(encoder_hidden_states=inp["negative_encoder_hidden_states"],
                       encoder_hidden_states_mask=inp["negative_encoder_hidden_states_mask"],
                       **common)[0]
        got = true_cfg(cond, uncond, 4.0)
        assert rel_err(got, true_cfg(w["cond"], w["uncond"], 4.0)) < 2e-5
        # A call with no partner (true_cfg_scale 1: one call a step) is computed when used.
        alone = model(encoder_hidden_states=inp["encoder_hidden_states"],
                      encoder_hidden_states_mask=inp["encoder_hidden_states_mask"], **common)[0]
        assert rel_err(alone + 0, w["cond"]) < 1e-5
        with pytest.raises(ValueError, match="guidance"):
            model(encoder_hidden_states=inp["encoder_hidden_states"], guidance=torch.ones(2),
                  **common)
    finally:
        model.close()


def test_qwen_image_pipeline(work):
    """diffusers' QwenImagePipeline unchanged (its scheduler with dynamic shifting, true CFG 4,
    3 steps; the prompt embeddings given, latents out) with seqpar's transformer on cfg 2 x
    Ulysses 2 in place of diffusers' own: the final latents within 3e-5 (measured 1.0e-5)."""
    import seqpar
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler,
                           QwenImagePipeline)

    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=4, dim_mult=[1, 1], num_res_blocks=1,
                                 temperal_downsample=[False]).eval()
    g = torch.Generator().manual_seed(0)
    emb, neg = torch.randn(1, 7, TEXT_DIM, generator=g), torch.randn(1, 5, TEXT_DIM, generator=g)

    def run(transformer):
        scheduler = FlowMatchEulerDiscreteScheduler(
            use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9, base_image_seq_len=256,
            max_image_seq_len=8192, shift_terminal=0.02, time_shift_type="exponential")
        pipe = QwenImagePipeline(scheduler=scheduler, vae=vae, text_encoder=None, tokenizer=None,
                                 transformer=transformer)
        return pipe(prompt_embeds=emb, prompt_embeds_mask=torch.ones(1, 7, dtype=torch.int64),
                    negative_prompt_embeds=neg,
                    negative_prompt_embeds_mask=torch.ones(1, 5, dtype=torch.int64),
                    true_cfg_scale=4.0, height=40, width=56, num_inference_steps=3,
                    output_type="latent", generator=torch.Generator().manual_seed(1)).images

    ref = run(work["model"])
    model = seqpar.QwenImageTransformer.from_pretrained(str(work["dir"]), cfg=2, ulysses_degree=2)
    try:
        got = run(model)
    finally:
        model.close()
    assert got.shape == ref.shape == (1, 140, CHANNELS)
    assert rel_err(got, ref) < 3e-5
