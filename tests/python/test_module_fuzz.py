"""The module's entry points under argument mutations: every keyword of attention,
decode_attention, Partition, Mesh, ThreadWorld, plan and the models' calls given values of the
wrong kind or range (None, text, negatives, 2**70, NaN, infinities, floats for integers, bools,
lists, dicts, objects, tensors of the wrong shape or dtype). Each call either works or raises
ValueError or TypeError whose message is one line naming what was wrong, never a crash, a hang,
another exception or pybind's "Invoked with" dump. The mutations are seeded: a failure replays."""
import math
import os
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
