"""The module's entry points under argument mutations: every keyword of attention,
decode_attention, Partition, Mesh, ThreadWorld, plan and the models' calls given values of the
wrong kind or range (None, text, negatives, 2**70, NaN, infinities, floats for integers, bools,
lists, dicts, objects, tensors of the wrong shape or dtype). Each call either works or raises
ValueError or TypeError whose message is one line naming what was wrong, never a crash, a hang,
another exception or pybind's "Invoked with" dump. The mutations are seeded: a failure replays.

The models (CausalLM, WanTransformer, QwenImageTransformer, FluxTransformer: tiny checkpoints,
on a mesh of threads and from_pretrained(comm=) in a ThreadWorld) are called with their arguments
mutated the same way, tensors also by NaN, infinities, other dtypes, shapes and kinds; after the
mutations a good call must still give its answer (no refusal stops the ranks). Finite inputs
that overflow inside a layer (3e38) are left out: that is a failure of the run, found by the
layer on its rank, and it stops the model's ranks by design."""
import random

import numpy as np
import pytest

from module_env import SEQPAR_PYTHONPATH  # noqa: F401  (puts the built module on sys.path)

import seqpar  # noqa: E402

BAD = [None, "", "x", -1, 0, 1, 3, 2**70, -2**70, 1.5, float("nan"), float("inf"),
       -float("inf"), True, False, [], [1, 2], {}, {"a": 1}, object(), b"\x00", 1e300,
       np.int64(2), np.float32(0.5), np.zeros((2, 2), np.float32)]
MUTATIONS_PER_ENTRY = 150


def acceptable(e: BaseException) -> bool:
    msg = str(e)
    return (isinstance(e, (ValueError, TypeError)) and "\n" not in msg.strip()
            and "Invoked with" not in msg and len(msg) < 2000)


def qkv(seq=8, heads=2, kv_heads=2, dim=8, dtype=np.float32):
    rng = np.random.default_rng(0)
    return [rng.standard_normal((1, seq, h, dim)).astype(dtype) for h in (heads, kv_heads, kv_heads)]


def mutate(rng, good: dict, tensors=()):
    """good with one to three keywords replaced by bad values (tensor keywords by bad arrays)."""
    args = dict(good)
    for key in rng.sample(sorted(good), k=rng.randint(1, min(3, len(good)))):
        if key in tensors:
            args[key] = rng.choice([None, [], np.zeros((2,), np.float32),
                                    np.zeros((1, 8, 2, 8), np.int32),
                                    np.zeros((1, 8, 3, 8), np.float32),
                                    np.zeros((1, 0, 2, 8), np.float32),
                                    np.full((1, 8, 2, 8), np.nan, np.float32),
                                    np.zeros((1, 8, 2, 8), np.float64), "x"])
        else:
            args[key] = rng.choice(BAD)
    return args


def run_one(call, args):
    try:
        call(**args)
    except BaseException as e:  # noqa: B902 - judged below
        assert acceptable(e), f"{type(e).__name__}: {e!s:.500} for {args!r:.500}"


def on_one_rank(fn):
    return seqpar.ThreadWorld(1, timeout=5).run(fn)[0]


@pytest.mark.parametrize("seed", range(3))
def test_attention(seed):
    rng = random.Random(seed)
    q, k, v = qkv()
    good = dict(q=q, k=k, v=v, strategy="ring", layout="contiguous", causal=False,
                ulysses_degree=None, ring_degree=None, sequence_parallel_size=None,
                ulysses_mode="uaa", pad=False, seq_len=None, text_tokens=0, softmax="online",
                softmax_scale=None, schedule="default", seq_lens=None, hardware="cpu-ethernet",
                return_lse=False)

    def call(**args):
        return on_one_rank(lambda comm: seqpar.attention(comm=comm, **args))

    for _ in range(MUTATIONS_PER_ENTRY // 3):
        run_one(call, mutate(rng, good, tensors=("q", "k", "v")))


@pytest.mark.parametrize("seed", range(2))
def test_decode_attention(seed):
    rng = random.Random(seed)
    q, k, v = qkv(seq=1)
    _, kc, vc = qkv(seq=16)
    good = dict(q=q, k_cache=kc, v_cache=vc, strategy=None, schedule="default", pass_=None,
                causal=True, softmax_scale=None, hardware="cpu-ethernet", return_lse=False)

    def call(**args):
        return on_one_rank(lambda comm: seqpar.decode_attention(comm=comm, **args))

    for _ in range(MUTATIONS_PER_ENTRY // 3):
        run_one(call, mutate(rng, good, tensors=("q", "k_cache", "v_cache")))


def test_partition_mesh_thread_world():
    rng = random.Random(7)
    for _ in range(MUTATIONS_PER_ENTRY):
        run_one(seqpar.Partition, mutate(rng, dict(seq=16, ranks=2, layout="zigzag",
                                                   seq_lens=[8, 8])))
        run_one(seqpar.Mesh, mutate(rng, dict(ulysses_degree=2, ring_degree=2, tp=1, cfg=1,
                                              ranks=None)))
        run_one(lambda **a: seqpar.ThreadWorld(**a).run(lambda comm: comm.rank),
                mutate(rng, dict(n=2, timeout=5.0, threads=1)))


def test_plan():
    rng = random.Random(11)
    good = dict(ranks=4, seq=4096, heads=8, kv_heads=0, head_dim=64, causal=True,
                hardware="cpu-ethernet", memory_limit_gb=0.0, ulysses_degree=0, ring_degree=0,
                strategy=None, layout=None, softmax=None, schedule=None, cached=0)
    for _ in range(MUTATIONS_PER_ENTRY):
        run_one(seqpar.plan, mutate(rng, good))


def test_causal_lm_calls(tmp_path):
    from test_module_exit import tiny_llama
    d = tiny_llama(str(tmp_path / "llama"))
    rng = random.Random(13)
    for _ in range(20):
        args = mutate(rng, dict(tp=1, ring_degree=2, ulysses_degree=1, layout="zigzag",
                                threads=1, timeout=10.0))
        try:
            seqpar.Llama.from_pretrained(d, **args).close()
        except BaseException as e:  # noqa: B902
            assert acceptable(e), f"{type(e).__name__}: {e!s:.500} for {args!r:.500}"
    with seqpar.Llama.from_pretrained(d, ring_degree=2) as model:
        good = dict(input_ids=[1, 2, 3], max_new_tokens=2, return_logits=False, ignore_eos=False,
                    allow_long_context=False)
        for _ in range(MUTATIONS_PER_ENTRY // 3):
            run_one(model.generate, mutate(rng, good))
        assert model.generate([1, 2, 3], 2).tolist() == [0, 0]  # still serving


# ---- the diffusion models' calls and comm= ---------------------------------------------------

MODEL_MUTATIONS = 200


def tensor_mutations(t):
    """Bad stand-ins for the tensor t: other kinds, shapes, dtypes and values."""
    import torch
    return [None, [], "x", 1.5, np.zeros((2,), np.float32), t[..., :1], t[:0], t[None],
            torch.zeros(()), t.double(), t.to(torch.int32), t > 0, t.to(torch.bfloat16),
            torch.full(t.shape, float("nan")), torch.full(t.shape, float("inf")),
            t.numpy().astype(object), [t], torch.complex(t.float(), t.float())]


def mutate_call(rng, good: dict, extra: dict):
    """good with one to three arguments replaced: tensors by tensor_mutations, the rest (and the
    keywords of extra, not in good) by BAD values."""
    import torch
    args = dict(good)
    keys = sorted([*good, *extra])
    for key in rng.sample(keys, k=rng.randint(1, 3)):
        value = good.get(key, extra.get(key))
        if isinstance(value, torch.Tensor) and rng.random() < 0.7:
            args[key] = rng.choice(tensor_mutations(value))
        else:
            args[key] = rng.choice(BAD)
    return args


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from test_module_args import tiny_checkpoints
    return tiny_checkpoints(str(tmp_path_factory.mktemp("fuzz_models")))


# The models' calls by checkpoint: (class, mesh, the maker of its good inputs in test_module_args,
# the call's other keywords with a good value).
MODEL_CALLS = {
    "wan": ("WanTransformer", dict(ring_degree=2), "wan_inputs",
            dict(negative_encoder_hidden_states=None, guidance_scale=1.0, guidance_scale_2=None,
                 encoder_hidden_states_image=None, attention_kwargs=None, return_dict=None)),
    "qwen": ("QwenImageTransformer", dict(cfg=2), "qwen_inputs",
             dict(txt_seq_lens=None, guidance=None, attention_kwargs=None, return_dict=True,
                  negative_encoder_hidden_states=None, negative_encoder_hidden_states_mask=None,
                  true_cfg_scale=1.0)),
    "flux": ("FluxTransformer", dict(cfg=2), "flux_inputs",
             dict(joint_attention_kwargs=None, controlnet_block_samples=None,
                  controlnet_single_block_samples=None, return_dict=True,
                  controlnet_blocks_repeat=False, negative_encoder_hidden_states=None,
                  negative_pooled_projections=None, negative_txt_ids=None, true_cfg_scale=1.0)),
}


def result_of(out):
    """A call's prediction as a plain tensor (a pending one on the cfg mesh filled)."""
    import torch
    out = out[0] if isinstance(out, tuple) else out
    return torch.as_tensor(out) * 1


@pytest.mark.filterwarnings("ignore:Passing `(img|txt)_ids` 3d")
@pytest.mark.parametrize("name", sorted(MODEL_CALLS))
def test_diffusion_model_calls(checkpoints, name):
    """Every mutation of a Wan, Qwen-Image or FLUX.1 call (threads mesh) works or is refused in
    one line; after them the good call still gives its answer (the ranks serve on)."""
    import test_module_args
    import torch
    cls, mesh, inputs, extra = MODEL_CALLS[name]
    rng = random.Random(17)
    with getattr(seqpar, cls).from_pretrained(checkpoints[name], timeout=10, **mesh) as model:
        good = getattr(test_module_args, inputs)(model.config)
        want = result_of(model(**good))
        worked = 0
        for _ in range(MODEL_MUTATIONS):
            args = mutate_call(rng, good, extra)
            try:
                result_of(model(**args))  # a pending prediction is computed here
                worked += 1
            except BaseException as e:  # noqa: B902 - judged below
                assert acceptable(e), f"{type(e).__name__}: {e!s:.500} for {args!r:.800}"
        print(f"{name}: {worked} of {MODEL_MUTATIONS} mutations worked, the others refused")
        assert torch.equal(result_of(model(**good)), want)


@pytest.mark.parametrize("name", ["llama", "wan", "qwen", "flux"])
def test_from_pretrained_on_a_comm(checkpoints, name):
    """from_pretrained(path, comm=...) with comm and the keywords mutated, on each rank of a
    ThreadWorld alike: refused in one line or loaded; then a good load and call on that comm."""
    cls = {"llama": "Llama", "wan": "WanTransformer", "qwen": "QwenImageTransformer",
           "flux": "FluxTransformer"}[name]
    good = dict(ring_degree=2, threads=None, timeout=None, tp=1, layout="contiguous")
    if name == "wan":
        good["boundary_ratio"] = None

    def rank(comm):
        rng = random.Random(19)  # every rank draws the same mutations
        for _ in range(30):
            args = mutate(rng, dict(good, comm=comm))
            try:
                getattr(seqpar, cls).from_pretrained(checkpoints[name], **args)
            except BaseException as e:  # noqa: B902 - judged below
                assert acceptable(e), f"{type(e).__name__}: {e!s:.500} for {args!r:.500}"
        model = getattr(seqpar, cls).from_pretrained(checkpoints[name], comm=comm, ring_degree=2)
        if name == "llama":
            return model.generate([1, 2, 3], 2).tolist()
        import test_module_args
        inputs = {"wan": "wan_inputs", "qwen": "qwen_inputs", "flux": "flux_inputs"}[name]
        return result_of(model(**getattr(test_module_args, inputs)(model.config))).tolist()

    results = seqpar.ThreadWorld(2, timeout=10).run(rank)
    assert results[0] == results[1]  # every rank the whole result
