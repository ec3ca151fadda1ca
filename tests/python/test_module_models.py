"""seqpar.Llama (seqpar.CausalLM) and seqpar.WanTransformer from Python against transformers'
LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and diffusers' WanTransformer3DModel, with the checkpoints and tolerances of test_llama_generate.py
and test_wan.py: identical greedy tokens and logits within 1e-3 (float32 weights), noise_pred
within 1e-4 relative, on one rank and on meshes of threads (the whole mesh in one object, and a
rank's model on its comm inside ThreadWorld.run), and a Llama under mpirun -np 2."""

import json
import os

import numpy as np
import pytest

from module_env import SEQPAR_PYTHONPATH, mpirun  # puts the built module on sys.path

import seqpar  # noqa: E402
import torch  # noqa: E402

import llama_ref as L  # noqa: E402
import qwen_ref as Q  # noqa: E402
from test_wan import (GRID_LATENT, NEG_LEN, TEXT_DIM, TEXT_LEN, make_model,  # noqa: E402
                      reference_loop, rel_err, save_diffusers)

HERE = os.path.dirname(os.path.abspath(__file__))
TOL_LOGITS = 1e-3  # test_llama_generate.py's float32 bound (measured there: 1.7e-4)
TOL_WAN = 1e-4     # test_wan.py's one call, fp32 weights
TOL_LOOP = 1e-3    # test_wan.py's guided loop
NEW = 6


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = L.make_checkpoint(str(tmp_path_factory.mktemp("llama") / "m"), tied=False,
                             dtype=torch.float32, sharded=False)
    prompt = L.prompt_of(11, L.TINY["vocab_size"], 3)
    tokens, logits = L.reference(path, prompt, NEW)
    return {"path": path, "prompt": prompt, "tokens": tokens, "logits": logits}


@pytest.mark.parametrize("mesh", [{}, {"tp": 2, "ring_degree": 2},
                                  {"ulysses_degree": 2, "layout": "zigzag"},
                                  {"tensor_parallel_size": 2, "sequence_parallel_size": 2,
                                   "schedule": "steal"},
                                  {"ulysses_degree": 2, "sequence_parallel_size": 4,
                                   "softmax": "const-max"}],
                         ids=["1rank", "tp2_ring2", "ulysses2_zigzag", "tp2_sp2_steal",
                              "usp_const_max"])
def test_llama_threads(llama, mesh):
    with seqpar.Llama.from_pretrained(llama["path"], **mesh) as model:
        want_ranks = mesh.get("tp", mesh.get("tensor_parallel_size", 1)) * \
            mesh.get("sequence_parallel_size", mesh.get("ring_degree", 1) *
                     mesh.get("ulysses_degree", 1))
        assert model.mesh.ranks == want_ranks
        tokens, logits = model.generate(torch.tensor([llama["prompt"]]), NEW, return_logits=True)
        assert tokens.dtype == torch.int64 and logits.shape == (NEW, L.TINY["vocab_size"])
        err = float(np.abs(logits.numpy() - llama["logits"]).max())
        print(f"llama {mesh}: max abs logit error {err:.3g}")
        assert tokens.tolist() == llama["tokens"]
        assert err <= TOL_LOGITS
        # The ranks stay loaded: a second call, a list prompt -> NumPy tokens.
        again = model.generate(llama["prompt"], 3)
        assert isinstance(again, np.ndarray) and again.tolist() == llama["tokens"][:3]


def test_llama_rank_models_on_a_comm(llama):
    def rank(comm):
        model = seqpar.Llama.from_pretrained(llama["path"], comm=comm,
                                             mesh=seqpar.ModelMesh(ring_degree=2))
        return model.generate(llama["prompt"], NEW).tolist()

    assert seqpar.ThreadWorld(2).run(rank) == [llama["tokens"]] * 2


def test_llama_bad_arguments(llama):
    with pytest.raises(ValueError, match=r"^tp 3 must divide num_attention_heads 8"):
        seqpar.Llama.from_pretrained(llama["path"], tp=3)
    with pytest.raises(ValueError, match=r"^ring_degree 0 is out of range"):
        seqpar.Llama.from_pretrained(llama["path"], ring_degree=0)
    with pytest.raises(ValueError, match="config.json"):
        seqpar.Llama.from_pretrained(os.path.dirname(llama["path"]) + "/missing")
    with seqpar.Llama.from_pretrained(llama["path"], ring_degree=2) as model:
        with pytest.raises(ValueError, match=r"^prompt token 381 at position 1 is outside"):
            model.generate([1, 381], 2)
        with pytest.raises(ValueError, match=r"^max_new_tokens 0 is out of range"):
            model.generate([1, 2], 0)
        # Token ids are integers: floats and bools are refused, not truncated.
        for ids, kind in (([1.5, 2.0], "float64"), ([True, False], "bool"),
                          (torch.tensor([1.0, 2.0]), "float32")):
            with pytest.raises(ValueError, match=rf"^input_ids holds {kind} values; expected "
                               r"integer token ids"):
                model.generate(ids, 2)
        assert model.generate(llama["prompt"], 2).tolist() == llama["tokens"][:2]  # still serving


def test_llama_int8(llama, tmp_path):
    """weights_dtype="int8" against transformers on the Q8_0-dequantized weights (the bound and
    the reference of test_llama_int8.py), and its refusals."""
    from test_llama_int8 import TOL, dequantized_copy
    ref = dequantized_copy(llama["path"], str(tmp_path / "q8"))
    want_tokens, want_logits = L.reference(ref, llama["prompt"], NEW)
    with seqpar.Llama.from_pretrained(llama["path"], weights_dtype="int8", tp=2) as model:
        assert model.weights_dtype == "int8"
        tokens, logits = model.generate(llama["prompt"], NEW, return_logits=True)
    err = float(np.abs(np.asarray(logits) - want_logits).max())
    print(f"llama int8 tp 2: max abs logit error {err:.3g}")
    assert tokens.tolist() == want_tokens and err <= TOL
    with pytest.raises(ValueError, match=r"^CausalLM: weights_dtype 'int4' is unknown; valid: "
                       r"'checkpoint', 'int8', 'int8-channel'$"):
        seqpar.Llama.from_pretrained(llama["path"], weights_dtype="int4")
    with pytest.raises(ValueError, match=r"^weights_dtype='int8' quantizes blocks of 32 inputs; "
                       r"the attention output's inputs per rank \(num_attention_heads x head_dim "
                       r"/ tp\) is 16 \(.*/config.json\); valid: multiples of 32$"):
        seqpar.Llama.from_pretrained(llama["path"], weights_dtype="int8", tp=8)
    with pytest.raises(TypeError, match="weights_dtype must be a str"):
        seqpar.Llama.from_pretrained(llama["path"], weights_dtype=8)


@pytest.mark.parametrize("mesh", [{}, {"tp": 4}], ids=["1rank", "tp4"])
def test_llama_larger_than_the_machine(tmp_path, mesh):
    """Refused from the headers, before a weight is read: the need per rank and what is
    available (the ranks of the mesh are threads of this process)."""
    path = L.make_sparse_checkpoint(str(tmp_path / "huge"))
    with pytest.raises(ValueError, match=r"^CausalLM.from_pretrained with .*huge \(829 GB of "
                       r"weights, tp \d\) needs about 829 GB of memory \(\d ranks? on this "
                       r"machine, .* each\) but this machine has .* available \(MemAvailable\)"):
        seqpar.Llama.from_pretrained(path, **mesh)


def test_llama_mpi(llama, tmp_path):
    """Every rank of mpirun -np 2 gets the reference's tokens (each writes its own file: the
    ranks' stdout would interleave)."""
    script = tmp_path / "llama_mpi.py"
    script.write_text(
        "import json, sys\nsys.path.insert(0, sys.argv[1])\nimport seqpar\n"
        "comm = seqpar.MpiComm()\n"
        "model = seqpar.Llama.from_pretrained(sys.argv[2], comm=comm, ring_degree=2)\n"
        "tokens = model.generate([int(t) for t in sys.argv[3].split(',')], int(sys.argv[4]))\n"
        "open(f'{sys.argv[5]}/rank{comm.rank}.json', 'w').write(json.dumps(tokens.tolist()))\n")
    r = mpirun(2, str(script), SEQPAR_PYTHONPATH, llama["path"],
               ",".join(map(str, llama["prompt"])), str(NEW), str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in range(2):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == llama["tokens"]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen_module")
    out = {}
    for family, kw in (("qwen2", dict(tied=True)), ("qwen3", dict(tied=False,
                                                                 attention_bias=True))):
        path = Q.make_checkpoint(str(root / family), family, dtype=torch.float32, sharded=False,
                                 seed=21, **kw)
        prompt = L.prompt_of(13, Q.VOCAB, 5)
        tokens, logits = Q.reference(path, prompt, NEW)
        out[family] = {"path": path, "prompt": prompt, "tokens": tokens, "logits": logits}
    return out


@pytest.mark.parametrize("family,cls,mesh", [
    ("qwen2", "CausalLM", {"tp": 2, "ring_degree": 2}),
    ("qwen3", "CausalLM", {"ulysses_degree": 2, "layout": "zigzag"}),
    ("qwen3", "Llama", {"tp": 4}),
], ids=["qwen2-causallm-tp2-ring2", "qwen3-causallm-ulysses2", "qwen3-llama-name-tp4"])
def test_qwen_threads(qwen, family, cls, mesh):
    """seqpar.CausalLM (and its other name seqpar.Llama) loads Qwen2 and Qwen3 directories."""
    ref = qwen[family]
    with getattr(seqpar, cls).from_pretrained(ref["path"], **mesh) as model:
        assert model.family == family
        assert model.architecture == {"qwen2": "Qwen2ForCausalLM",
                                      "qwen3": "Qwen3ForCausalLM"}[family]
        tokens, logits = model.generate(torch.tensor([ref["prompt"]]), NEW, return_logits=True)
        err = float(np.abs(logits.numpy() - ref["logits"]).max())
        print(f"{family} {cls} {mesh}: max abs logit error {err:.3g}")
        assert tokens.tolist() == ref["tokens"]
        assert err <= TOL_LOGITS


def test_qwen_rank_models_on_a_comm_and_mpi(qwen, tmp_path):
    ref = qwen["qwen3"]

    def rank(comm):
        model = seqpar.CausalLM.from_pretrained(ref["path"], comm=comm, ring_degree=2)
        return model.generate(ref["prompt"], NEW).tolist()

    assert seqpar.ThreadWorld(2).run(rank) == [ref["tokens"]] * 2
    script = tmp_path / "qwen_mpi.py"
    script.write_text(
        "import json, sys\nsys.path.insert(0, sys.argv[1])\nimport seqpar\n"
        "comm = seqpar.MpiComm()\n"
        "model = seqpar.CausalLM.from_pretrained(sys.argv[2], comm=comm, tp=2)\n"
        "tokens = model.generate([int(t) for t in sys.argv[3].split(',')], int(sys.argv[4]))\n"
        "open(f'{sys.argv[5]}/rank{comm.rank}.json', 'w').write(json.dumps(tokens.tolist()))\n")
    r = mpirun(2, str(script), SEQPAR_PYTHONPATH, ref["path"], ",".join(map(str, ref["prompt"])),
               str(NEW), str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    for k in range(2):
        assert json.loads((tmp_path / f"rank{k}.json").read_text()) == ref["tokens"]


def test_qwen_bad_arguments(qwen, tmp_path):
    with pytest.raises(ValueError, match=r"^tp 3 must divide num_attention_heads 8"):
        seqpar.CausalLM.from_pretrained(qwen["qwen2"]["path"], tp=3)
    import shutil
    path = str(tmp_path / "sliding")
    shutil.copytree(qwen["qwen2"]["path"], path)
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg["use_sliding_window"] = True
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ValueError, match=r"config.json: use_sliding_window is true"):
        seqpar.CausalLM.from_pretrained(path)


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    d = tmp_path_factory.mktemp("wan_module")
    m = make_model(1)
    save_diffusers([m], str(d / "diffusers"))
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, 4, *GRID_LATENT, generator=g)
    text = torch.randn(1, TEXT_LEN, TEXT_DIM, generator=g)
    neg = torch.randn(1, NEG_LEN, TEXT_DIM, generator=g)
    t = torch.tensor([737.0])
    with torch.no_grad():
        cond = m(hidden_states=x, timestep=t, encoder_hidden_states=text).sample
        uncond = m(hidden_states=x, timestep=t, encoder_hidden_states=neg).sample
    return {"path": str(d / "diffusers"), "model": m, "x": x, "text": text, "neg": neg,
            "cond": cond, "guided": uncond + 5.0 * (cond - uncond)}


@pytest.mark.parametrize("mesh,guided", [({}, False), ({"tp": 2, "ring_degree": 2}, False),
                                         ({"cfg": 2, "ulysses_degree": 2}, True),
                                         ({"cfg_parallel_size": 2, "sequence_parallel_size": 2,
                                           "softmax": "const-max"}, True)],
                         ids=["1rank", "tp2_ring2", "cfg2_ulysses2_guided",
                              "cfg2_sp2_const_max_guided"])
def test_wan_forward(wan, mesh, guided):
    with seqpar.WanTransformer.from_pretrained(wan["path"], **mesh) as model:
        assert model.config["in_channels"] == 4 and model.config["layout"] == "diffusers"
        if guided:
            out = model(wan["x"], 737.0, wan["text"], wan["neg"], guidance_scale=5.0)
            ref = wan["guided"]
        else:
            out = model.forward(wan["x"], torch.tensor([737.0]), wan["text"])
            ref = wan["cond"]
        err = rel_err(out, ref)
        print(f"wan {mesh}: relative error {err:.3g}")
        assert isinstance(out, torch.Tensor) and out.shape == ref.shape
        assert err <= TOL_WAN
        # NumPy in, NumPy out
        out_np = model.forward(wan["x"].numpy(), 737.0, wan["text"].numpy(),
                               wan["neg"].numpy() if guided else None,
                               guidance_scale=5.0 if guided else 1.0)
        assert isinstance(out_np, np.ndarray) and np.array_equal(out_np, out.numpy())


def test_wan_sample_and_rank_models(wan):
    ref, _ = reference_loop([wan["model"]], None, wan["x"], wan["text"], wan["neg"], 2, 5.0, 5.0,
                            3.0)

    def rank(comm):
        model = seqpar.WanTransformer.from_pretrained(wan["path"], comm=comm, ring_degree=2)
        return model.sample(wan["x"], wan["text"], wan["neg"], num_inference_steps=2,
                            guidance_scale=5.0, shift=3.0)

    outs = seqpar.ThreadWorld(2).run(rank)
    assert torch.equal(outs[0], outs[1])
    err = rel_err(outs[0], ref)
    print(f"wan 2-step guided loop, ring 2: relative error {err:.3g}")
    assert err <= TOL_LOOP


def test_wan_bad_arguments(wan):
    with pytest.raises(ValueError, match=r"^tp 3 does not divide the 4 heads"):
        seqpar.WanTransformer.from_pretrained(wan["path"], tp=3)
    with seqpar.WanTransformer.from_pretrained(wan["path"]) as model:
        with pytest.raises(ValueError, match=r"tensor 'latents' has shape \[1, 3, 3, 10, 18\]"):
            model(wan["x"][:, :3], 737.0, wan["text"])
        with pytest.raises(ValueError, match=r"timestep 2000 is invalid"):
            model(wan["x"], 2000.0, wan["text"])
        assert rel_err(model(wan["x"], 737.0, wan["text"]), wan["cond"]) <= TOL_WAN


def test_readme_model_block(llama):
    """The README's model example runs as it stands, on the tiny checkpoint."""
    readme = os.path.join(HERE, "..", "..", "README.md")
    text = open(readme).read().split("## Use it from Python", 1)[1].split("\n## ", 1)[0]
    block = text.split("```python\n")[2].split("```", 1)[0]
    assert '"Llama-3.2-1B"' in block
    scope = {}
    exec(compile(block.replace('"Llama-3.2-1B"', repr(llama["path"])), "README.md", "exec"),
         scope)
    assert scope["tokens"].shape == (8,) and scope["logits"].shape == (8, L.TINY["vocab_size"])
