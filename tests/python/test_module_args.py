"""Bad arguments to the Python module's models and calls (issue 24): each is refused with a
one-line ValueError or TypeError naming the argument and what would be valid, in the caller's
thread before any rank sees it, and the model keeps serving; never pybind's "Unable to cast", a
crash, a hang or a silently truncated value.

The checkpoints are tiny (one or two layers, a handful of tokens): a Llama of zero weights, a Wan
2.1 transformer, a Qwen-Image and a FLUX.1-dev transformer made with diffusers. "Refused before
any rank sees it" is checked by counting the jobs handed to the ranks (_ThreadRanks.call): a
refused call hands none over. Non-regular files (a FIFO nobody writes) run in a subprocess with
a timeout, so a blocking open fails the test instead of hanging it."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from module_env import SEQPAR_PYTHONPATH  # puts the built module on sys.path

import seqpar  # noqa: E402

SEQPAR = os.environ.get("SEQPAR_BIN", "seqpar")

# Tiny inputs of each model (the checkpoints of tiny_checkpoints).
WAN_LATENTS = (1, 4, 1, 4, 6)    # B, C, F, H, W: 1 x 2 x 3 patches of 1x2x2
QWEN_IMAGE = (1, 2, 3)           # frames, height, width in patches: 6 tokens
FLUX_TOKENS, TEXT_LEN = 6, 3


def tiny_checkpoints(root: str) -> dict:
    """{"llama", "wan", "qwen", "flux"}: the directories of the tiny checkpoints under root."""
    import test_flux
    import test_qwen_image
    import test_wan
    from test_module_exit import tiny_llama

    paths = {name: os.path.join(root, name) for name in ("llama", "wan", "qwen", "flux")}
    tiny_llama(paths["llama"])
    test_wan.save_diffusers([test_wan.make_model(1, layers=1)], paths["wan"])
    test_qwen_image.make_model().save_pretrained(paths["qwen"])
    test_flux.make_model(1, True).save_pretrained(paths["flux"])
    return paths


def wan_inputs(config) -> dict:
    g = torch.Generator().manual_seed(3)
    return dict(latents=torch.randn(*WAN_LATENTS, generator=g), timestep=500.0,
                encoder_hidden_states=torch.randn(1, TEXT_LEN, config["text_dim"], generator=g))


def qwen_inputs(config) -> dict:
    g = torch.Generator().manual_seed(4)
    S = QWEN_IMAGE[0] * QWEN_IMAGE[1] * QWEN_IMAGE[2]
    return dict(hidden_states=torch.randn(1, S, config["in_channels"], generator=g),
                encoder_hidden_states=torch.randn(1, TEXT_LEN, config["joint_attention_dim"],
                                                  generator=g),
                encoder_hidden_states_mask=torch.ones(1, TEXT_LEN, dtype=torch.int64),
                timestep=torch.tensor([0.5]), img_shapes=[[QWEN_IMAGE]])


def flux_inputs(config) -> dict:
    g = torch.Generator().manual_seed(5)
    ids = torch.zeros(FLUX_TOKENS, 3)
    ids[:, 2] = torch.arange(FLUX_TOKENS)
    return dict(hidden_states=torch.randn(1, FLUX_TOKENS, config["in_channels"], generator=g),
                encoder_hidden_states=torch.randn(1, TEXT_LEN, config["joint_attention_dim"],
                                                  generator=g),
                pooled_projections=torch.randn(1, config["pooled_projection_dim"], generator=g),
                timestep=torch.tensor([0.5]), img_ids=ids, txt_ids=torch.zeros(TEXT_LEN, 3),
                guidance=torch.tensor([3.5]))


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return tiny_checkpoints(str(tmp_path_factory.mktemp("args")))


def refused(call, kind, pattern, model=None):
    """call() raises kind with a one-line message matching pattern, handing no job to the ranks
    of model."""
    before = model.jobs if model is not None else 0
    with pytest.raises(kind, match=pattern) as e:
        call()
    assert "\n" not in str(e.value) and "Unable to cast" not in str(e.value), str(e.value)
    if model is not None:
        assert model.jobs == before, f"{e.value} reached the ranks"


def refuser(model):
    """refused(call, kind, pattern) for model, whose jobs to the ranks are counted from now on
    (model.jobs)."""
    model.jobs, call = 0, model._ranks.call

    def counted(job):
        model.jobs += 1
        return call(job)

    model._ranks.call = counted
    return lambda call, kind, pattern: refused(call, kind, pattern, model)


def test_wan_call_arguments(paths):
    with seqpar.WanTransformer.from_pretrained(paths["wan"], ring_degree=2) as model:
        refuse = refuser(model)
        good = wan_inputs(model.config)
        want = model(**good)
        for value in (None, [1.0], "5", True, {}):
            refuse(lambda: model(**good, guidance_scale=value), ValueError,
                   r"^guidance_scale .* is not a number; valid: a number 0\.\.100$")
        refuse(lambda: model(**good, guidance_scale_2="x"), ValueError,
               r"^guidance_scale_2 'x' is not a number; valid: a number 0\.\.100, or None$")
        refuse(lambda: model(**good, return_dict=1), ValueError, r"^return_dict 1 is not True")
        refuse(lambda: model(**{**good, "timestep": "x"}), ValueError,
               r"^timestep 'x' holds text; expected real numbers")
        refuse(lambda: model(**{**good, "timestep": [1.0, object()]}), ValueError,
               r"^timestep .* is not an array of numbers")
        refuse(lambda: model(**good, attention_kwargs=[1]), ValueError,
               r"^attention_kwargs \[1\] is not supported.*valid: None or \{\}$")
        refuse(lambda: model.sample(good["latents"], good["encoder_hidden_states"],
                                    num_inference_steps=1.5), ValueError,
               r"^num_inference_steps 1\.5 is not an integer; valid: 1 to 1048576$")
        refuse(lambda: model.sample(good["latents"], good["encoder_hidden_states"],
                                    num_inference_steps=2**70), ValueError,
               r"^num_inference_steps \d+ is out of range; valid: 1 to 1048576$")
        refuse(lambda: model.sample(good["latents"], good["encoder_hidden_states"],
                                    shift=None), ValueError,
               r"^shift None is not a number; valid: a number in \(0, 100\]$")
        refuse(lambda: model.sample(good["latents"], good["encoder_hidden_states"],
                                    guidance_scale="x"), ValueError, r"^guidance_scale 'x'")
        # Non-finite inputs (or beyond float32) are refused here, not where a layer overflows.
        nan = good["latents"].clone()
        nan[0, 1, 0, 2, 3] = float("nan")
        refuse(lambda: model(**{**good, "latents": nan}), ValueError,
               r"^latents holds nan at index \[0, 1, 0, 2, 3\]; expected finite float32 numbers$")
        huge = good["encoder_hidden_states"].double() * 1e300
        refuse(lambda: model(**{**good, "encoder_hidden_states": huge}), ValueError,
               r"^encoder_hidden_states holds -?[0-9.]+e\+(299|300) at index \[0, 0, 0\]; "
               r"expected finite float32 numbers$")
        # Values of the right kind go to the library, which refuses them alike on every rank.
        with pytest.raises(ValueError, match=r"^guidance_scale nan is invalid; valid: 0\.\.100$"):
            model(**good, guidance_scale=float("nan"))
        assert torch.equal(model(**good), want)  # still serving
        # NumPy and 0-d torch numbers are numbers.
        assert torch.equal(model(**good, guidance_scale=np.float32(2.0)), want)
        assert torch.equal(model(**good, guidance_scale=torch.tensor(2.0)), want)


def test_qwen_image_call_arguments(paths):
    with seqpar.QwenImageTransformer.from_pretrained(paths["qwen"], ring_degree=2) as model:
        refuse = refuser(model)
        good = qwen_inputs(model.config)
        want = model(**good).sample
        for value in (None, "4", [4.0], False):
            refuse(lambda: model(**good, true_cfg_scale=value), ValueError,
                   r"^true_cfg_scale .* is not a number; valid: a number 0\.\.100$")
        refuse(lambda: model(**good, return_dict="yes"), ValueError, r"^return_dict 'yes'")
        for shapes in ([[(1, 2, 3.0)]], [[(1, True, 6)]], [[(1, 2**70, 3)]]):
            refuse(lambda: model(**{**good, "img_shapes": shapes}), ValueError, r"^img_shapes")
        refuse(lambda: model(**good, negative_encoder_hidden_states_mask=torch.ones(1, 2)),
               ValueError, r"^negative_encoder_hidden_states_mask is given without")
        refuse(lambda: model(**{**good, "hidden_states": "x"}), ValueError,
               r"^hidden_states 'x' holds text")
        assert torch.equal(model(**good).sample, want)  # still serving


def test_flux_call_arguments(paths):
    with seqpar.FluxTransformer.from_pretrained(paths["flux"], ring_degree=2) as model:
        refuse = refuser(model)
        good = flux_inputs(model.config)
        want = model(**good).sample
        for value in (None, "4", [4.0], True):
            refuse(lambda: model(**good, true_cfg_scale=value), ValueError,
                   r"^true_cfg_scale .* is not a number; valid: a number 0\.\.100$")
        refuse(lambda: model(**good, return_dict=None), ValueError, r"^return_dict None")
        refuse(lambda: model(**good, controlnet_blocks_repeat="no"), ValueError,
               r"^controlnet_blocks_repeat 'no'")
        refuse(lambda: model(**{**good, "guidance": "x"}), ValueError, r"^guidance 'x' holds")
        refuse(lambda: model(**good, joint_attention_kwargs=0), ValueError,
               r"^joint_attention_kwargs 0 is not supported")
        assert torch.equal(model(**good).sample, want)  # still serving


def test_generate_arguments(paths):
    with seqpar.Llama.from_pretrained(paths["llama"], ring_degree=2) as model:
        refuse = refuser(model)
        # Bools (and floats) among integer token ids are refused as a bool alone is.
        for ids in ([1, True], [[1, True]], (np.int64(1), np.bool_(False)), [True]):
            refuse(lambda: model.generate(ids, 2), ValueError,
                   r"^input_ids holds bool values; expected integer token ids$")
        refuse(lambda: model.generate([1, 2.0], 2), ValueError,
               r"^input_ids holds float64 values; expected integer token ids$")
        refuse(lambda: model.generate([1, [2, 3]], 2), ValueError,
               r"^input_ids \[1, \[2, 3\]\] is not a list of token ids")
        refuse(lambda: model.generate([1, 2], 2, return_logits=1), ValueError,
               r"^return_logits 1 is not True or False$")
        refuse(lambda: model.generate([1, 2], 2.0), ValueError, r"^max_new_tokens 2\.0")
        assert model.generate([1, 2], 2).tolist() == [0, 0]  # still serving


def test_type_error_on_every_rank_leaves_ranks_serving(paths):
    """A TypeError raised alike on every rank (pybind's cast of a job's argument, before any
    communication) refuses the call and leaves the ranks serving, as a ValueError does: the last
    line of defence behind the callers' own checks."""
    with seqpar.Llama.from_pretrained(paths["llama"], ring_degree=2) as model:
        with pytest.raises(TypeError, match="incompatible function arguments"):
            model._call(lambda m: m.generate("not ids", 2, False, False))
        assert model.generate([1, 2], 2).tolist() == [0, 0]


@pytest.mark.parametrize("cls", ["Llama", "WanTransformer", "QwenImageTransformer",
                                 "FluxTransformer"])
def test_from_pretrained_keywords(paths, cls):
    """comm, path (and Wan's boundary_ratio) of the wrong kind: one line naming the keyword and
    what is valid, not "Unable to cast Python instance to C++ type"."""
    model = getattr(seqpar, cls)
    path = paths[{"Llama": "llama", "WanTransformer": "wan", "QwenImageTransformer": "qwen",
                  "FluxTransformer": "flux"}[cls]]
    for comm in (1, "x", object(), [seqpar.ThreadWorld]):
        refused(lambda: model.from_pretrained(path, comm=comm), ValueError,
                r"^comm .* is not a communicator; valid: the comm ThreadWorld\.run hands each "
                r"rank, seqpar\.MpiComm\(\), seqpar\.TorchComm\(\), or None")
    refused(lambda: model.from_pretrained(1), ValueError,
            r"^path 1 is not a directory name; valid: a str or os\.PathLike")
    refused(lambda: model.from_pretrained(path + "\0x"), ValueError, r"holds a NUL character")

    def rank(comm):
        with pytest.raises(ValueError, match=r"^threads and timeout are for the ranks"):
            model.from_pretrained(path, comm=comm, timeout=5.0)
        return model.from_pretrained(path, comm=comm).mesh.ranks  # a comm as it should be

    assert seqpar.ThreadWorld(1).run(rank) == [1]


def test_wan_boundary_ratio(paths):
    for value in ([], "x", object(), {}):
        refused(lambda: seqpar.WanTransformer.from_pretrained(paths["wan"], boundary_ratio=value),
                ValueError, r"^boundary_ratio .* is not a number; valid: a number in \(0, 1\), "
                r"or None \(the checkpoint's\)$")
    for value in (0, 1.5, float("nan")):  # numbers: the library's range
        refused(lambda: seqpar.WanTransformer.from_pretrained(paths["wan"], boundary_ratio=value),
                ValueError, r"^boundary_ratio .* is invalid; valid: \(0, 1\)$")
    with seqpar.WanTransformer.from_pretrained(paths["wan"], boundary_ratio=0.875) as model:
        assert model.config["boundary_ratio"] == 0.875


def test_thread_world_threads_bound():
    """ThreadWorld's threads bound is the command line's (core/limits.h: 4096 threads a
    process)."""
    cli = subprocess.run([SEQPAR, "run", "--threads", "5000"], capture_output=True, text=True,
                         timeout=60)
    assert "--threads 5000 is out of range; valid: 0 to 4096" in cli.stderr, cli.stderr
    for threads in (4097, 5000, 100000):
        with pytest.raises(ValueError, match=rf"^threads {threads} is out of range; valid: 1 to "
                           r"4096$"):
            seqpar.ThreadWorld(1, threads=threads)
    with pytest.raises(ValueError, match=r"^threads 0 is invalid"):
        seqpar.ThreadWorld(1, threads=0)


def test_other_keywords_pybind_would_cast():
    """Keywords that went to pybind unchecked, whose wrong types gave its "Invoked with" dump or
    a message not naming them."""
    with pytest.raises(ValueError, match=r"^mpi4py_comm 1 is not an mpi4py communicator; valid: "
                       r"an mpi4py\.MPI\.Comm, or None \(MPI\.COMM_WORLD\)$"):
        seqpar.MpiComm(1)
    with pytest.raises(ValueError, match=r"^heads 1180591620717411303424 is out of range; "
                       r"valid: 1 to 65536$"):
        seqpar.Mesh(tp=2).rows(2**70, 4)

    def rank(comm):
        with pytest.raises(ValueError, match=r"^message 1 is not a string"):
            comm.abort(1)
        return comm.rank

    assert seqpar.ThreadWorld(1).run(rank) == [0]


def test_softmax_scale_zero_refused():
    """softmax_scale=0.0 is refused, not read as the default 1/sqrt(D) (None is the default)."""
    q = np.random.default_rng(0).standard_normal((1, 4, 2, 8)).astype(np.float32)
    calls = {"attention": lambda comm, s: seqpar.attention(q, q, q, comm=comm, softmax_scale=s),
             "decode_attention": lambda comm, s: seqpar.decode_attention(
                 q[:, :1], q, q, comm=comm, softmax_scale=s)}
    for name, call in calls.items():
        def rank(comm):
            for scale, message in ((0.0, "0.0 is invalid"), (-0.0, "-0.0 is invalid"),
                                   (-1, "-1 is invalid"), (float("inf"), "inf is invalid"),
                                   (True, "True is not a number"), ("2", "'2' is not a number")):
                with pytest.raises(ValueError, match=rf"^softmax_scale {message}; give a positive "
                                   r"finite number \(None: 1/sqrt\(head_dim\)\)$"):
                    call(comm, scale)
            default, explicit = call(comm, None), call(comm, 1 / np.sqrt(8))
            return np.array_equal(default, explicit)

        assert seqpar.ThreadWorld(1).run(rank) == [True], name


FIFO_SCRIPT = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import seqpar
fifo, models = sys.argv[2], json.loads(sys.argv[3])
q = np.zeros((1, 4, 2, 8), np.float32)
calls = {
    "plan": lambda: seqpar.plan(seq=64, heads=2, ranks=2, hardware=fifo),
    "attention": lambda: seqpar.ThreadWorld(1).run(
        lambda c: seqpar.attention(q, q, q, comm=c, strategy="auto", hardware=fifo)),
    "decode_attention": lambda: seqpar.ThreadWorld(1).run(
        lambda c: seqpar.decode_attention(q[:, :1], q, q, comm=c, hardware=fifo)),
}
for cls, path in models:
    calls[f"{cls} {path}"] = lambda cls=cls, path=path: getattr(seqpar, cls).from_pretrained(path)
for name, call in calls.items():
    try:
        call()
        print(json.dumps([name, "accepted", ""]), flush=True)
    except Exception as e:
        print(json.dumps([name, type(e).__name__, str(e)]), flush=True)
"""


def test_non_regular_files_refused(tmp_path, paths):
    """A FIFO (that nobody writes: opening it to read would block forever) as hardware= of plan,
    attention and decode_attention, and as a model directory's config.json, is refused at once
    with one line."""
    fifo = str(tmp_path / "profile.json")
    os.mkfifo(fifo)
    models = []
    for cls, src, config in (("Llama", "llama", "config.json"),
                             ("WanTransformer", "wan", "transformer/config.json"),
                             ("WanTransformer", "wan", "model_index.json"),
                             ("QwenImageTransformer", "qwen", "config.json"),
                             ("FluxTransformer", "flux", "config.json")):
        d = tmp_path / f"{cls}_{config.replace('/', '_')}"
        subprocess.run(["cp", "-r", paths[src], str(d)], check=True)
        os.unlink(d / config)
        os.mkfifo(d / config)
        models.append((cls, str(d)))
    r = subprocess.run([sys.executable, "-c", FIFO_SCRIPT, SEQPAR_PYTHONPATH, fifo,
                        json.dumps(models)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(rows) == 3 + len(models), r.stdout
    for name, kind, message in rows:
        print(name, kind, message)
        assert kind == "ValueError" and "\n" not in message, (name, kind, message)
        if name in ("plan", "attention", "decode_attention"):
            assert message == f"hardware '{fifo}' is a FIFO, not a regular file; give a profile " \
                              "JSON file", message
        else:  # names the directory (the library's message names the file and what it is)
            assert name.split(" ", 1)[1] in message, (name, message)


def test_errors_name_the_keywords():
    """The library's errors carry the parameters they name as data; Python spells them as its
    keywords (the command line as its flags, e.g. --kv-heads), the whole message one line."""
    with pytest.raises(ValueError) as e:
        seqpar.plan(ranks=4, seq=64, heads=8, kv_heads=3, head_dim=16)
    assert str(e.value) == "heads 8 is not divisible by kv_heads 3; valid kv_heads: 1, 2, 4, 8"
    q = np.zeros((1, 8, 4, 8), np.float32)

    def rank(comm):
        with pytest.raises(ValueError) as err:
            seqpar.attention(q, q, q, comm=comm, strategy="ring", ulysses_degree=2)
        return str(err.value)

    assert set(seqpar.ThreadWorld(4).run(rank)) == {
        "strategy ring takes no ulysses_degree or ring_degree; use strategy usp to combine them"}
