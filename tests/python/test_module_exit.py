"""The module at the edges of a Python process: exit with a model still open, a failed
from_pretrained caught and then exit, Ctrl-C while ranks run (honoured, the ranks stopped, the next
ThreadWorld works) and inside a model's call (the model stopped, no stale results), exit while a
daemon thread is inside ThreadWorld.run with its ranks computing, and ThreadWorld's arguments
checked as the command line checks them. Each scenario runs in a fresh interpreter; a crash shows
as its exit status, a hang as its timeout."""

import json
import os
import struct
import subprocess
import sys

import pytest

from module_env import SEQPAR_PYTHONPATH  # noqa: F401  (puts the built module on sys.path)

import seqpar


def tiny_llama(d):
    """A Llama of hidden 8, 2 heads over 1 kv head, vocab 16: config.json and zero weights."""
    os.makedirs(d, exist_ok=True)
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=8,
               intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
               num_key_value_heads=1, vocab_size=16, max_position_embeddings=64,
               rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    p = "model.layers.0."
    shapes = {"model.embed_tokens.weight": [16, 8], "model.norm.weight": [8],
              p + "input_layernorm.weight": [8], p + "post_attention_layernorm.weight": [8],
              p + "self_attn.q_proj.weight": [8, 8], p + "self_attn.k_proj.weight": [4, 8],
              p + "self_attn.v_proj.weight": [4, 8], p + "self_attn.o_proj.weight": [8, 8],
              p + "mlp.gate_proj.weight": [16, 8], p + "mlp.up_proj.weight": [16, 8],
              p + "mlp.down_proj.weight": [8, 16]}
    header, off = {}, 0
    for name in sorted(shapes):
        size = 4
        for x in shapes[name]:
            size *= x
        header[name] = {"dtype": "F32", "shape": shapes[name], "data_offsets": [off, off + size]}
        off += size
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + bytes(off))
    return d


def run_script(code, timeout=120):
    env = dict(os.environ, PYTHONPATH=SEQPAR_PYTHONPATH)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("mesh", ["tp=1", "tp=2", "ring_degree=2"])
def test_exit_with_a_model_still_open(tmp_path, mesh):
    d = tiny_llama(str(tmp_path / "llama"))
    for _ in range(3):  # an exit racing the ranks' threads failed one time in a few
        r = run_script(f"import seqpar\nm = seqpar.Llama.from_pretrained({d!r}, {mesh})\n"
                       "print(m.generate([1, 2, 3], max_new_tokens=2))")
        assert r.returncode == 0, r.stderr


def test_exit_after_a_failed_load_is_clean(tmp_path):
    # The ranks are still unwinding their failure while the interpreter exits: five times over.
    code = ("import seqpar\ntry:\n    seqpar.Llama.from_pretrained('/nonexistent', tp=2)\n"
            "except ValueError as e:\n    print('refused')\n")
    for _ in range(5):
        r = run_script(code)
        assert r.returncode == 0 and "refused" in r.stdout, r.stderr


def test_ctrl_c_stops_the_ranks():
    # The ranks would run forever; SIGINT after half a second must end the run with
    # KeyboardInterrupt, and a new ThreadWorld must then work.
    code = ("import os, signal, threading, torch, seqpar\n"
            "def rank(comm):\n"
            "    q = torch.randn(1, 128, 2, 32)\n"
            "    while True:\n"
            "        seqpar.attention(q, q, q, comm=comm)\n"
            "threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
            "try:\n"
            "    seqpar.ThreadWorld(2).run(rank)\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted')\n"
            "print(seqpar.ThreadWorld(2).run(lambda comm: comm.rank))\n")
    r = run_script(code, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["interrupted", "[0,", "1]"], r.stdout


def test_ctrl_c_in_a_model_call(tmp_path):
    # A generate on a 2-rank mesh that would run for minutes: SIGINT after a second ends it with
    # KeyboardInterrupt (a hang shows as the script's timeout), the model's ranks stop, and the
    # model refuses later calls (they would read the interrupted call's results) while a new one
    # serves.
    d = tiny_llama(str(tmp_path / "llama"))
    code = ("import os, signal, threading, seqpar\n"
            f"m = seqpar.Llama.from_pretrained({d!r}, ring_degree=2)\n"
            "threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
            "try:\n"
            "    m.generate([1, 2, 3], max_new_tokens=1000000, allow_long_context=True)\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted')\n"
            "try:\n"
            "    m.generate([1, 2, 3], max_new_tokens=2)\n"
            "except RuntimeError as e:\n"
            "    print('refused', 'interrupted' in str(e))\n"
            f"n = seqpar.Llama.from_pretrained({d!r}, ring_degree=2)\n"
            "print(n.generate([1, 2, 3], max_new_tokens=2).tolist())\n")
    r = run_script(code, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["interrupted", "refused", "True", "[0,", "0]"], r.stdout


DAEMON_RANKS = """
import sys, threading, numpy as np, seqpar
if len(sys.argv) > 1:  # the exit's stop left out: the crash this test guards against
    import atexit
    atexit.unregister(seqpar._core._stop_runs_at_exit)
computing = threading.Event()
def rank(comm):
    q = np.random.rand(1, 256, 2, 64).astype(np.float32)
    while True:
        seqpar.attention(q, q, q, comm=comm)
        computing.set()
def world():
    try:
        seqpar.ThreadWorld(4, threads=1).run(rank)
    except RuntimeError as e:
        print(e)
        try:
            seqpar.ThreadWorld(2).run(lambda comm: comm.rank)
        except RuntimeError as e:
            print(e)
threading.Thread(target=world, daemon=True).start()
computing.wait()  # the interpreter exits once the ranks have run a call
"""


def test_exit_while_a_daemon_thread_runs_ranks():
    # The interpreter exits while a daemon thread of the script waits in ThreadWorld.run and its
    # four ranks compute: the ranks are stopped and waited for before CPython ends daemon threads,
    # and a run started after that is refused. Without the stop, 5 exits in 16 crashed (SIGABRT
    # "terminate called without an active exception", or SIGSEGV): sixteen times over.
    for _ in range(16):
        r = run_script(DAEMON_RANKS, timeout=60)
        assert r.returncode == 0, r.stderr
        # The daemon thread may be ended before it tries another run; if it tries, refused.
        assert r.stdout.splitlines() in (
            ["stopped: the interpreter is exiting"],
            ["stopped: the interpreter is exiting",
             "ThreadWorld.run refused: the interpreter is exiting"]), r.stdout


@pytest.mark.parametrize("call,message", [
    (lambda: seqpar.ThreadWorld(2.5), "ranks 2.5 is not an integer"),
    (lambda: seqpar.ThreadWorld(True), "ranks True is not an integer"),
    (lambda: seqpar.ThreadWorld(0), "ranks 0 is invalid"),
    (lambda: seqpar.ThreadWorld(2, timeout=0), "timeout 0 is out of range"),
    (lambda: seqpar.ThreadWorld(2, timeout=-1), "timeout -1 is out of range"),
    (lambda: seqpar.ThreadWorld(2, timeout=float("nan")), "timeout nan is out of range"),
    (lambda: seqpar.ThreadWorld(2, threads=100000), "threads 100000 is out of range"),
    (lambda: seqpar.ThreadWorld(65536, threads=1), "threads in one process exceeds the maximum"),
])
def test_thread_world_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()
