"""seqpar.WanTransformer dropped into diffusers' WanPipeline (pipe.transformer, pipe.transformer_2)
against the same pipeline with diffusers' WanTransformer3DModel.

A tiny pipeline: test_wan.py's transformer (sharp attention) with 4 latent channels, a tiny
AutoencoderKLWan, UniPCMultistepScheduler with flow sigmas (Wan 2.1's default), prompt and negative
embeddings passed in (no text encoder), 9 frames of 48 x 80 (latents 3 x 6 x 10: 45 tokens, which
divide none of the meshes), 3 steps, guidance 5. The pipeline runs unchanged; the frames and the
final latents (taken by callback_on_step_end) are compared with diffusers' run from the same seed.

Bounds on the final latents (max |difference| relative to their max |value|) and on the frames
(max |difference|; frames are in [0, 1]): the pipelines' fp32 rounding, amplified by sharp
attention, 3 steps and guidance (test_wan.py: diffusers' own fp32 loop is 3e-4 from its fp64 one).
Each is the larger of TOL (measured with AVX-512 kernels, the same on every mesh) and the spread of
diffusers' own pipeline when its transformer's input is nudged by a few float32 steps (spread.py;
Wan 2.1 with guidance 5: 1.1e-4 to 4.6e-4 in the latents, where seqpar with its and oneDNN's
kernels capped at AVX2 measured 1.8e-4 to 3.6e-4):
  Wan 2.1, guidance 5:                 latents 3e-4 (measured 1.1e-4), frames 2e-4 (9.7e-5)
  Wan 2.1, guidance 1 (cond only):     latents 3e-5 (measured 8.9e-6), frames 5e-5 (1.4e-5)
  Wan 2.2, guidance 5 and 3:           latents 1e-3 (measured 4.7e-4), frames 1e-3 (3.3e-4)
Returning the uncond branch for the cond one moves the latents by 1.6 relative, the frames by 0.3.
"""

import os

import numpy as np
import pytest

from module_env import SEQPAR_PYTHONPATH, mpirun  # puts the built module on sys.path
from spread import NUDGES, tolerance

import seqpar  # noqa: E402
import torch  # noqa: E402
from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline  # noqa: E402

from test_wan import TEXT_DIM, make_model  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TOL = {"wan21": (3e-4, 2e-4), "wan21 cond only": (3e-5, 5e-5),
       "wan22": (1e-3, 1e-3)}  # (latents, frames)
CALL = {"height": 48, "width": 80, "num_frames": 9, "num_inference_steps": 3}
BOUNDARY = 0.7  # the 3 steps' timesteps are 999, 856, 599: two high-noise, one low-noise

# The saved pipelines have no text encoder (the embeddings are given), so loading them says so.
NO_TEXT_ENCODER = {"tokenizer": None, "text_encoder": None}
MESHES = [({}, "1rank"), ({"ulysses_degree": 2}, "ulysses2"),
          ({"cfg_parallel_size": 2, "ulysses_degree": 2}, "cfg2_ulysses2")]


def make_pipeline(experts):
    """A WanPipeline around diffusers transformers `experts` (two: Wan 2.2 at BOUNDARY)."""
    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True],
                           latents_mean=[0.1, -0.2, 0.0, 0.3],
                           latents_std=[1.5, 0.8, 1.0, 1.2]).eval()
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        flow_shift=3.0)
    return WanPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler,
                       transformer=experts[0], transformer_2=experts[1] if len(experts) > 1
                       else None, boundary_ratio=BOUNDARY if len(experts) > 1 else None)


def embeddings():
    g = torch.Generator().manual_seed(7)
    return torch.randn(1, 7, TEXT_DIM, generator=g), torch.randn(1, 5, TEXT_DIM, generator=g)


def nudged(pipe, experts, e, guidance_scale=5.0, **kw):
    """generate(pipe) with every call's hidden_states scaled by 1 + e on its way into `experts`."""
    def scale(_module, args, kwargs):
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"] * (1 + e)}
    hooks = [m.register_forward_pre_hook(scale, with_kwargs=True) for m in experts]
    try:
        return generate(pipe, guidance_scale, **kw)
    finally:
        for h in hooks:
            h.remove()


def generate(pipe, guidance_scale=5.0, **kw):
    """(frames (1, 9, 48, 80, 3), final latents) of pipe from seed 0."""
    prompt, negative = embeddings()
    final = {}

    def keep(pipe, i, t, tensors):
        final["latents"] = tensors["latents"].clone()
        return {}

    frames = pipe(prompt_embeds=prompt, negative_prompt_embeds=negative,
                  guidance_scale=guidance_scale, generator=torch.Generator().manual_seed(0),
                  output_type="np", callback_on_step_end=keep, **CALL, **kw).frames
    return frames, final["latents"]


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    """Wan 2.1 (one transformer) and Wan 2.2 (two experts): the pipelines saved, and diffusers'
    results with guidance 5 and with guidance 1."""
    d = tmp_path_factory.mktemp("wan_pipeline")
    out = {}
    for name, experts in (("wan21", [make_model(1)]), ("wan22", [make_model(3), make_model(4)])):
        pipe = make_pipeline(experts)
        pipe.save_pretrained(str(d / name))
        kw = {"guidance_scale_2": 3.0 if len(experts) > 1 else None}
        with torch.no_grad():
            out[name] = {"path": str(d / name), "experts": experts, "guided": generate(pipe, **kw)}
            out[name]["guided spread"] = spread(pipe, experts, out[name]["guided"], **kw)
    with torch.no_grad():
        pipe = make_pipeline(out["wan21"]["experts"])
        out["wan21"]["cond_only"] = generate(pipe, 1.0)
        out["wan21"]["cond_only spread"] = spread(pipe, out["wan21"]["experts"],
                                                  out["wan21"]["cond_only"], 1.0)
    return out


def spread(pipe, experts, want, guidance_scale=5.0, **kw):
    """How far diffusers' own results move with its transformers' input nudged (spread.py): the
    largest of errors() over the nudges, for the latents and the frames."""
    moved = [errors(nudged(pipe, experts, e, guidance_scale, **kw), want) for e in NUDGES]
    return tuple(max(m[i] for m in moved) for i in range(2))


def errors(got, want):
    """(relative error of the latents, max |difference| of the frames)"""
    frames, latents = got
    return (float((latents - want[1]).abs().max() / want[1].abs().max()),
            float(np.abs(frames - want[0]).max()))


def check(got, want, bounds, what, moved):
    """moved: spread() of the reference `want`."""
    latents_err, frames_err = errors(got, want)
    bound = [tolerance(TOL[bounds][i], moved[i]) for i in range(2)]
    print(f"{what}: latents {latents_err:.3g} relative, frames {frames_err:.3g} (bounds "
          f"{bound[0]:.3g}, {bound[1]:.3g})")
    assert latents_err <= bound[0] and frames_err <= bound[1]


@pytest.mark.parametrize("mesh", [m for m, _ in MESHES], ids=[i for _, i in MESHES])
def test_wan21_pipeline(wan, mesh):
    w = wan["wan21"]
    pipe = make_pipeline(w["experts"])
    with seqpar.WanTransformer.from_pretrained(os.path.join(w["path"], "transformer"),
                                               **mesh) as model:
        pipe.transformer = model
        check(generate(pipe), w["guided"], "wan21", f"wan 2.1 pipeline {mesh}",
              w["guided spread"])


@pytest.mark.parametrize("mesh", [{}, {"cfg": 2, "ring_degree": 2}], ids=["1rank", "cfg2_ring2"])
def test_wan22_two_experts(wan, mesh):
    """WanPipeline(transformer=, transformer_2=) with seqpar's, each expert's directory loaded
    on its own, switched by the pipeline at its boundary_ratio with guidance 5 and
    guidance_scale_2 3."""
    w = wan["wan22"]
    with seqpar.WanTransformer.from_pretrained(os.path.join(w["path"], "transformer"),
                                               **mesh) as high, \
            seqpar.WanTransformer.from_pretrained(os.path.join(w["path"], "transformer_2"),
                                                  **mesh) as low:
        pipe = make_pipeline([high, low])
        check(generate(pipe, guidance_scale_2=3.0), w["guided"], "wan22",
              f"wan 2.2 pipeline {mesh}", w["guided spread"])


def test_pipeline_from_pretrained_on_the_cfg_mesh_cond_only(wan):
    """WanPipeline.from_pretrained(..., transformer=None), then seqpar's transformer, with
    guidance_scale 1: no uncond call comes, so each waiting cond prediction is computed alone
    when the scheduler uses it."""
    w = wan["wan21"]
    pipe = WanPipeline.from_pretrained(w["path"], transformer=None, **NO_TEXT_ENCODER)
    with seqpar.WanTransformer.from_pretrained(os.path.join(w["path"], "transformer"),
                                               cfg=2) as model:
        pipe.transformer = model
        check(generate(pipe, 1.0), w["cond_only"], "wan21 cond only", "cond only, cfg 2",
              w["cond_only spread"])


def test_the_call_diffusers_makes(wan):
    """The model as diffusers' WanTransformer3DModel: config, dtype, device, cache_context,
    return_dict; on the cfg mesh the cond prediction waits for its partner and is computed alone
    when the partner's latents or timestep differ (or were changed in place)."""
    m = wan["wan21"]["experts"][0]
    prompt, negative = embeddings()
    g = torch.Generator().manual_seed(3)
    x, x2 = torch.randn(1, 4, 3, 6, 10, generator=g), torch.randn(1, 4, 3, 6, 10, generator=g)
    t = torch.tensor([700.0])

    def ref(latents, text, timestep=t):
        with torch.no_grad():
            return m(hidden_states=latents, timestep=timestep, encoder_hidden_states=text).sample

    def err(got, want):
        return float((got - want).abs().max() / want.abs().max())

    with seqpar.WanTransformer.from_pretrained(os.path.join(wan["wan21"]["path"], "transformer"),
                                               cfg=2) as model:
        assert model.config.in_channels == model.config["in_channels"] == 4
        assert model.config.num_attention_heads == m.config.num_attention_heads
        assert model.dtype == torch.float32 and model.device == torch.device("cpu")
        with model.cache_context("cond"):
            out = model(hidden_states=x, timestep=t, encoder_hidden_states=prompt)
        assert err(out.sample, ref(x, prompt)) <= 1e-4 and out[0] is out.sample
        # The partner's latents differ: each is computed on its own.
        cond = model(hidden_states=x, timestep=t, encoder_hidden_states=prompt,
                     return_dict=False)[0]
        uncond = model(hidden_states=x2, timestep=t, encoder_hidden_states=negative,
                       return_dict=False)[0]
        assert err(uncond, ref(x2, negative)) <= 1e-4 and err(cond, ref(x, prompt)) <= 1e-4
        # The partner's timestep differs.
        cond = model(hidden_states=x, timestep=t, encoder_hidden_states=prompt,
                     return_dict=False)[0]
        uncond = model(hidden_states=x, timestep=t - 1, encoder_hidden_states=negative,
                       return_dict=False)[0]
        assert err(uncond, ref(x, negative, t - 1)) <= 1e-4 and err(cond, ref(x, prompt)) <= 1e-4
        # The latents changed in place after the cond call: the cond prediction is still x's.
        y = x.clone()
        cond = model(hidden_states=y, timestep=t, encoder_hidden_states=prompt,
                     return_dict=False)[0]
        y.add_(1.0)
        uncond = model(hidden_states=y, timestep=t, encoder_hidden_states=negative,
                       return_dict=False)[0]
        assert err(cond, ref(x, prompt)) <= 1e-4 and err(uncond, ref(y, negative)) <= 1e-4
        # Paired: both at once, plain tensors after use.
        cond = model(hidden_states=x, timestep=t, encoder_hidden_states=prompt,
                     return_dict=False)[0]
        uncond = model(hidden_states=x, timestep=t, encoder_hidden_states=negative,
                       return_dict=False)[0]
        guided = uncond + 5.0 * (cond - uncond)
        assert type(guided) is torch.Tensor and type(uncond) is torch.Tensor
        assert err(guided, ref(x, negative) + 5.0 * (ref(x, prompt) - ref(x, negative))) <= 1e-4
        # What it does not run is refused in one line.
        with pytest.raises(ValueError, match=r"^encoder_hidden_states_image: .*not supported"):
            model(hidden_states=x, timestep=t, encoder_hidden_states=prompt,
                  encoder_hidden_states_image=prompt)
        with pytest.raises(ValueError, match=r"^attention_kwargs \{'scale': 0.5\} is not"):
            model(hidden_states=x, timestep=t, encoder_hidden_states=prompt,
                  attention_kwargs={"scale": 0.5})
        with pytest.raises(ValueError, match=r"tensor 'latents' has shape \[1, 3, 3, 6, 10\]"):
            model(hidden_states=x[:, :3], timestep=t, encoder_hidden_states=prompt)  # now
        # seqpar's own spelling still returns the prediction itself.
        assert err(model(x, 700.0, prompt, negative, guidance_scale=5.0), guided) <= 1e-5
        assert err(model.forward(latents=x, timestep=t, encoder_hidden_states=prompt),
                   ref(x, prompt)) <= 1e-4


def test_mesh_keywords(wan):
    path = os.path.join(wan["wan21"]["path"], "transformer")
    with pytest.raises(ValueError, match=r"^WanTransformer.from_pretrained: keyword 'cfg_size' is "
                       r"unknown; valid: mesh, comm, boundary_ratio, threads, timeout, activations, tp, "
                       r"tensor_parallel_size, .*cfg_parallel_size"):
        seqpar.WanTransformer.from_pretrained(path, cfg_size=2)
    with pytest.raises(ValueError, match=r"^CausalLM.from_pretrained: keyword 'ring' is unknown"):
        seqpar.CausalLM.from_pretrained(path, ring=2)
    with pytest.raises(ValueError, match=r"^ModelMesh: keyword 'cfg_degree' is unknown"):
        seqpar.ModelMesh(cfg_degree=2)
    assert seqpar.ModelMesh(cfg_parallel_size=2, tensor_parallel_size=2,
                            sequence_parallel_size=4, ulysses_degree=2) == \
        seqpar.ModelMesh(cfg=2, tp=2, ring_degree=2, ulysses_degree=2)
    with pytest.raises(ValueError, match=r"^ulysses_degree 3 does not divide "
                       r"sequence_parallel_size 4"):
        seqpar.ModelMesh(sequence_parallel_size=4, ulysses_degree=3)
    with seqpar.WanTransformer.from_pretrained(path, cfg_parallel_size=2,
                                               sequence_parallel_size=2) as model:
        assert (model.mesh.cfg, model.mesh.ring_degree, model.mesh.ranks) == (2, 2, 4)


def test_pipeline_under_mpirun(wan, tmp_path):
    """Every rank of mpirun -np 4 runs the same pipeline script with comm=seqpar.MpiComm() on a
    cfg 2 x ulysses 2 mesh; rank 0 writes the frames (wan_pipeline_mpi.py)."""
    w = wan["wan21"]
    r = mpirun(4, os.path.join(HERE, "wan_pipeline_mpi.py"), w["path"], str(tmp_path / "out.npz"),
               timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    got = np.load(tmp_path / "out.npz")
    check((got["frames"], torch.from_numpy(got["latents"])), w["guided"], "wan21",
          "mpirun -np 4", w["guided spread"])
