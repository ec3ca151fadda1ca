"""seqpar denoise and seqpar.WanTransformer on Wan 2.1 image-to-video checkpoints, against
diffusers' WanTransformer3DModel (image_dim, added_kv_proj_dim) called with
encoder_hidden_states_image.

A tiny I2V transformer is made with diffusers (save_pretrained) and the same weights renamed to
Wan's original layout (img_emb.proj.0/1/3/4, blocks.i.cross_attn.k_img/v_img/norm_k_img,
model_type "i2v"). The image path is made to matter: norm_added_k scales of 3..6 (sharp
attention to the image tokens, as norm_k for the text) and non-trivial image-embedder
LayerNorms, so skipping norm_added_k, the image attention, or one of the embedder's layers moves
the output far past the tolerance. The text is 512 tokens: diffusers splits [image; text] 512
tokens from its end (an I2V checkpoint is refused other lengths); the image 257 CLIP tokens.
The latents' 8 channels predict 4 (I2V concatenates the condition latents to the noise).

Tolerances, relative to the reference's max |value| (measured on every mesh and both layouts;
docs/models.md):
  one call, fp32: 1e-5 (measured 6.1e-6..7.0e-6);
  guided with scale 5: 4e-5 (measured 1.6e-5..1.7e-5). The guided prediction 5c - 4u adds the
  two branches' errors 5 and 4 times over while its max |value| is only 2.6 times the branches'
  (12.8 against 4.9 here), so one-call errors of 1e-5 allow 9 x 4.9 / 12.8 x 1e-5 = 3.5e-5;
  bf16 weights against diffusers on the same bf16 values in float64: 1e-5 (measured 5.7e-6..7.7e-6
  on an AMX Xeon, the avx2 and the avx512 kernels; seqpar computes in fp32. Against diffusers in
  fp32 the two sides' roundings, each about 8e-6 of float64 there, reached 1.04e-5).
Breaking the image path (norm_k_img skipped, or the image attention added twice) moves every case
to about 0.5. The reference's latents moved by 5e-7 x randn (2.1e-5 on every one-call row,
5.3e-5 guided) fail every fp32 case, as they would not with the earlier bounds 3e-5 and 1e-4; the
bf16 rows against the unrounded fp32 weights fail at 8.9e-2.
"""

import copy
import json
import os
import subprocess

import pytest
import torch
from diffusers import WanTransformer3DModel
from safetensors.torch import load_file, save_file

from module_env import SEQPAR_PYTHONPATH  # noqa: F401  puts the built module on sys.path
from test_wan import BLOCK_MAP, MPIEXEC, SEQPAR, TOP_MAP, rel_err, seqpar

HEADS, HEAD_DIM, TEXT_DIM, IMAGE_DIM, LAYERS = 4, 20, 16, 24, 2
IN_CH, OUT_CH = 8, 4
GRID_LATENT = (3, 10, 18)  # 3 x 5 x 9 = 135 patches: uneven on every mesh
TEXT_LEN, IMAGE_LEN = 512, 257
TOL, TOL_GUIDED, TOL_BF16 = 1e-5, 4e-5, 1e-5

I2V_BLOCK_MAP = {**BLOCK_MAP, "attn2.add_k_proj": "cross_attn.k_img",
                 "attn2.add_v_proj": "cross_attn.v_img",
                 "attn2.norm_added_k": "cross_attn.norm_k_img"}
I2V_TOP_MAP = {**TOP_MAP,
               "condition_embedder.image_embedder.norm1": "img_emb.proj.0",
               "condition_embedder.image_embedder.ff.net.0.proj": "img_emb.proj.1",
               "condition_embedder.image_embedder.ff.net.2": "img_emb.proj.3",
               "condition_embedder.image_embedder.norm2": "img_emb.proj.4"}


def original_name(name):
    if name.startswith("blocks."):
        i, rest = name[len("blocks."):].split(".", 1)
        # Longest first: attn2.norm_added_k before attn2.norm_k.
        for d in sorted(I2V_BLOCK_MAP, key=len, reverse=True):
            if rest == d or rest.startswith(d + "."):
                return f"blocks.{i}.{I2V_BLOCK_MAP[d]}{rest[len(d):]}"
        raise KeyError(name)
    for d in sorted(I2V_TOP_MAP, key=len, reverse=True):
        if name == d or name.startswith(d + "."):
            return I2V_TOP_MAP[d] + name[len(d):]
    raise KeyError(name)


def make_model(seed):
    torch.manual_seed(seed)
    m = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=HEADS, attention_head_dim=HEAD_DIM,
        in_channels=IN_CH, out_channels=OUT_CH, text_dim=TEXT_DIM, freq_dim=32, ffn_dim=64,
        num_layers=LAYERS, rope_max_seq_len=64, image_dim=IMAGE_DIM,
        added_kv_proj_dim=HEADS * HEAD_DIM).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if ".norm_q." in name or ".norm_k." in name or ".norm_added_k." in name:
                p.uniform_(3.0, 6.0)  # sharp attention, to the text and to the image
            elif name.endswith("scale_shift_table"):
                p.normal_(0.0, 0.3)
            elif ".norm2." in name or "image_embedder.norm" in name:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.05)
            else:
                p.normal_(0.0, 1.0 / p.shape[1] ** 0.5 if p.ndim == 2 else 0.2)
    return m


def save_original(model, path):
    os.makedirs(path, exist_ok=True)
    sd = {original_name(k): v.contiguous() for k, v in model.state_dict().items()}
    save_file(sd, os.path.join(path, "diffusion_pytorch_model.safetensors"))
    c = model.config
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"_class_name": "WanModel", "model_type": "i2v",
                   "dim": c.num_attention_heads * c.attention_head_dim, "ffn_dim": c.ffn_dim,
                   "freq_dim": c.freq_dim, "in_dim": c.in_channels, "out_dim": c.out_channels,
                   "num_heads": c.num_attention_heads, "num_layers": c.num_layers,
                   "text_len": 512, "text_dim": c.text_dim, "eps": 1e-6}, f)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("wan_i2v")
    m = make_model(11)
    m.save_pretrained(str(d / "diffusers"))
    save_original(m, str(d / "original"))
    g = torch.Generator().manual_seed(5)
    inp = {"latents": torch.randn(1, IN_CH, *GRID_LATENT, generator=g),
           "encoder_hidden_states": torch.randn(1, TEXT_LEN, TEXT_DIM, generator=g),
           "negative_encoder_hidden_states": torch.randn(1, TEXT_LEN, TEXT_DIM, generator=g),
           "encoder_hidden_states_image": torch.randn(1, IMAGE_LEN, IMAGE_DIM, generator=g),
           "timestep": torch.tensor([613.0])}
    save_file(inp, str(d / "in.safetensors"))
    cond_only = {k: v for k, v in inp.items() if k != "negative_encoder_hidden_states"}
    save_file(cond_only, str(d / "in_cond.safetensors"))
    save_file({k: v for k, v in cond_only.items() if k != "encoder_hidden_states_image"},
              str(d / "in_noimage.safetensors"))
    kw = dict(hidden_states=inp["latents"], timestep=inp["timestep"],
              encoder_hidden_states_image=inp["encoder_hidden_states_image"])
    with torch.no_grad():
        cond = m(encoder_hidden_states=inp["encoder_hidden_states"], **kw).sample
        uncond = m(encoder_hidden_states=inp["negative_encoder_hidden_states"], **kw).sample
    return {"dir": d, "model": m, "inputs": inp, "cond": cond,
            "guided": uncond + 5.0 * (cond - uncond)}


def run_call(work, layout, mesh, inputs="in_cond.safetensors", guidance=5.0):
    out = str(work["dir"] / f"out_{layout}_{'_'.join(mesh) or 'one'}.safetensors")
    seqpar(["--model", str(work["dir"] / layout), "--inputs", str(work["dir"] / inputs),
            "--output", out, "--guidance", str(guidance), *mesh])
    return load_file(out)["noise_pred"]


MESHES = [[], ["--ulysses-degree", "2"], ["--ring-degree", "2"], ["--tp", "2"],
          ["--ulysses-degree", "8", "--ulysses-mode", "uaa"],
          ["--ulysses-degree", "2", "--ulysses-mode", "strict", "--pad"],
          ["--ring-degree", "8"], ["--ulysses-degree", "2", "--ring-degree", "4"]]


@pytest.mark.parametrize("layout", ["diffusers", "original"])
@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: "_".join(a.strip("-") for a in m) or "one")
def test_noise_pred_fp32(work, layout, mesh):
    got = run_call(work, layout, mesh)
    assert got.shape == work["cond"].shape
    err = rel_err(got, work["cond"])
    print(f"i2v fp32 {layout} {mesh}: rel err {err:.2e}")
    assert err <= TOL


@pytest.mark.parametrize("mesh", [["--cfg", "2", "--ulysses-degree", "2"],
                                  ["--cfg", "2", "--ulysses-degree", "2", "--ring-degree", "2"]],
                         ids=["cfg2_u2", "cfg2_u2_r2"])
def test_guided_cfg2_ulysses2(work, mesh):
    got = run_call(work, "diffusers", mesh, inputs="in.safetensors")
    err = rel_err(got, work["guided"])
    print(f"i2v guided {mesh}: rel err {err:.2e}")
    assert err <= TOL_GUIDED


@pytest.fixture(scope="module")
def work_bf16(work):
    """The model's weights stored in bf16 by diffusers, and diffusers' prediction with the same
    bf16 values in a float64 model (seqpar keeps the bf16 weights and computes in fp32; an fp32
    reference would add its own rounding, as large as seqpar's)."""
    path = work["dir"] / "bf16"
    copy.deepcopy(work["model"]).to(torch.bfloat16).save_pretrained(str(path))
    stored = load_file(str(path / "diffusion_pytorch_model.safetensors"))
    up = copy.deepcopy(work["model"])
    up.load_state_dict({k: v.float() for k, v in stored.items()})
    up = up.double()
    inp = {k: v.double() if v.is_floating_point() else v for k, v in work["inputs"].items()}
    with torch.no_grad():
        return up(hidden_states=inp["latents"], timestep=inp["timestep"],
                  encoder_hidden_states=inp["encoder_hidden_states"],
                  encoder_hidden_states_image=inp["encoder_hidden_states_image"]).sample


@pytest.mark.parametrize("mesh", [[], ["--tp", "2", "--ulysses-degree", "2"]],
                         ids=["one", "tp2_u2"])
def test_bf16(work, work_bf16, mesh):
    got = run_call(work, "bf16", mesh)
    err = rel_err(got.double(), work_bf16)
    print(f"i2v bf16 {mesh}: rel err {err:.2e}")
    assert err <= TOL_BF16


def test_image_required_and_refused_in_one_line(work, tmp_path):
    d = work["dir"]

    def fails(model, inputs):
        cmd = [SEQPAR, "denoise", "--model", str(model), "--inputs", str(inputs),
               "--output", str(tmp_path / "x.safetensors")]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stdout + r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        return r.stderr

    assert "tensor 'encoder_hidden_states_image' is missing" in fails(
        d / "original", d / "in_noimage.safetensors")
    short = {k: v for k, v in work["inputs"].items() if k != "negative_encoder_hidden_states"}
    short["encoder_hidden_states"] = short["encoder_hidden_states"][:, :77].contiguous()
    save_file(short, str(tmp_path / "short.safetensors"))
    assert "tensor 'encoder_hidden_states' has 77 tokens" in fails(
        d / "diffusers", tmp_path / "short.safetensors")
    # A text-to-video checkpoint (the same without the image parts) refuses the image.
    t2v = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=HEADS, attention_head_dim=HEAD_DIM,
        in_channels=IN_CH, out_channels=OUT_CH, text_dim=TEXT_DIM, freq_dim=32, ffn_dim=64,
        num_layers=1, rope_max_seq_len=64)
    t2v.save_pretrained(str(tmp_path / "t2v"))
    assert "tensor 'encoder_hidden_states_image' is given" in fails(
        tmp_path / "t2v", d / "in_cond.safetensors")


def test_python_diffusers_call(work):
    import seqpar

    inp = work["inputs"]
    with seqpar.WanTransformer.from_pretrained(str(work["dir"] / "original"),
                                               ulysses_degree=2) as model:
        assert model.config.image_dim == IMAGE_DIM
        out = model(hidden_states=inp["latents"], timestep=inp["timestep"],
                    encoder_hidden_states=inp["encoder_hidden_states"],
                    encoder_hidden_states_image=inp["encoder_hidden_states_image"])
        err = rel_err(out.sample, work["cond"])
        print(f"i2v python u2: rel err {err:.2e}")
        assert err <= TOL
        with pytest.raises(ValueError, match=r"tensor 'encoder_hidden_states_image' is missing"):
            model(hidden_states=inp["latents"], timestep=inp["timestep"],
                  encoder_hidden_states=inp["encoder_hidden_states"])
    # WanImageToVideoPipeline's two calls on a cfg mesh of 2: the first waits, the second (same
    # latents, timestep and image) runs both branches at once, one on each cfg group.
    with seqpar.WanTransformer.from_pretrained(str(work["dir"] / "diffusers"), cfg=2) as model:
        kw = dict(hidden_states=inp["latents"], timestep=inp["timestep"],
                  encoder_hidden_states_image=inp["encoder_hidden_states_image"],
                  return_dict=False)
        cond = model(encoder_hidden_states=inp["encoder_hidden_states"], **kw)[0]
        uncond = model(encoder_hidden_states=inp["negative_encoder_hidden_states"], **kw)[0]
        assert cond.fill is None  # filled by the paired call, not computed alone
        err = rel_err(uncond + 5.0 * (cond - uncond), work["guided"])
        print(f"i2v python cfg2 paired, guided: rel err {err:.2e}")
        assert err <= TOL_GUIDED


@pytest.mark.skipif(not MPIEXEC, reason="no SEQPAR_MPIEXEC")
def test_mpi(work):
    out = str(work["dir"] / "out_mpi.safetensors")
    seqpar(["--model", str(work["dir"] / "original"), "--inputs",
            str(work["dir"] / "in.safetensors"), "--output", out, "--guidance", "5", "--tp", "2",
            "--ulysses-degree", "2"], mpi_np=4)
    err = rel_err(load_file(out)["noise_pred"], work["guided"])
    print(f"i2v mpi tp2 u2 guided: rel err {err:.2e}")
    assert err <= TOL_GUIDED
