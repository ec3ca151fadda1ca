"""seqpar under torchrun: seqpar.TorchComm over torch.distributed (gloo) on 4 processes against
PyTorch's SDPA, the threads backend's CommStats, transformers' tokens and diffusers' noise
prediction; MpiComm refusing a torchrun world; a failing rank making the others fail instead of hang (torchrun_check.py runs on
the ranks, one scenario per launch, so torch is imported as few times as possible)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from module_env import SEQPAR_PYTHONPATH

# The ranks import the module built here (ctest: from SEQPAR_PYTHONPATH).
pytest.importorskip("seqpar", reason="the Python module seqpar is not built (SEQPAR_BUILD_PYTHON)")

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "torchrun_check.py")
# A hang fails the test here; every scenario ends well within it when the code is right.
LAUNCH_TIMEOUT = 240


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(**extra):
    # A long deadline: failures must arrive through abort or a closed connection, not a timeout.
    return dict(os.environ, PYTHONPATH=os.pathsep.join([SEQPAR_PYTHONPATH, HERE]),
                OMP_NUM_THREADS="1", SEQPAR_TIMEOUT_S="200", **extra)


def torchrun(nproc, *args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), CHECK, *args]
    return subprocess.run(cmd, env=rank_env(), capture_output=True, text=True,
                          timeout=LAUNCH_TIMEOUT)


def lines(r, word):
    return [line for line in r.stdout.splitlines() if line.endswith(f" {word}")]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from llama_ref import make_checkpoint, prompt_of, reference
    import torch

    path = str(make_checkpoint(tmp_path_factory.mktemp("llama") / "ckpt", tied=False,
                               dtype=torch.float32, sharded=True))
    prompt = prompt_of(40, 381, 3)
    tokens, _ = reference(path, prompt, 6)
    return {"path": path, "prompt": prompt, "tokens": tokens}


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    """A tiny Wan transformer (test_wan.py's) in diffusers' layout, its inputs and diffusers'
    noise prediction, for the ranks to load."""
    import torch
    from test_wan import GRID_LATENT, TEXT_DIM, TEXT_LEN, make_model, save_diffusers

    d = tmp_path_factory.mktemp("wan")
    m = make_model(1)
    save_diffusers([m], str(d / "diffusers"))
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, 4, *GRID_LATENT, generator=g)
    text = torch.randn(1, TEXT_LEN, TEXT_DIM, generator=g)
    with torch.no_grad():
        cond = m(hidden_states=x, timestep=torch.tensor([737.0]), encoder_hidden_states=text).sample
    torch.save({"x": x, "text": text, "cond": cond}, d / "io.pt")
    return {"path": str(d / "diffusers"), "io": str(d / "io.pt")}


def test_four_ranks_against_sdpa_threads_and_transformers(llama, wan, tmp_path):
    spec = dict(llama, wan=wan, meshes=[{"tp": 2, "ring_degree": 2},
                                        {"ulysses_degree": 2, "ring_degree": 2,
                                         "layout": "zigzag"}])
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps(spec))
    r = torchrun(4, "main", str(cases))
    out = r.stdout + r.stderr
    assert r.returncode == 0 and not lines(r, "FAILED"), out
    # per rank: the world, 20 attention cases, 3 decode cases, 2 CausalLMs, 1 WanTransformer;
    # rank 0: 23 CommStats
    assert len(lines(r, "ok")) == 4 * (1 + 20 + 3 + 2 + 1) + 23, out
    for line in r.stdout.splitlines():
        if line.startswith("SUMMARY ") or "WanTransformer" in line:
            print(line)


def test_mpi_comm_refuses_and_abort_reaches_the_others():
    r = torchrun(2, "refuse")
    out = r.stdout + r.stderr
    assert r.returncode == 0 and not lines(r, "FAILED"), out
    assert len(lines(r, "ok")) == 3, out  # refused on both ranks; rank 0 got rank 1's abort
    said = [line for line in r.stdout.splitlines() if "MpiComm says:" in line][0]
    print(said)


def two_processes(*args, on_start=None):
    """torchrun_check.py on 2 plain processes with torchrun's environment (torchrun itself would
    stop one rank as soon as the other ends; this checks what seqpar does). on_start(procs) runs
    once both have started."""
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, CHECK, *args], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env=rank_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                                           RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                                           LOCAL_WORLD_SIZE="2"))
             for r in range(2)]
    if on_start:
        on_start(procs)
    return procs, [p.communicate(timeout=LAUNCH_TIMEOUT)[0] for p in procs]


def kill_once_stopped(procs):
    """Once rank 1 has stopped itself (state T): let it run 2 ms in every 20 for a second, so
    that its transfers crawl and rank 0 waits on one in flight, then SIGKILL it while stopped."""
    stat = f"/proc/{procs[1].pid}/stat"
    for _ in range(int(LAUNCH_TIMEOUT / 0.05)):
        if procs[1].poll() is not None:
            break
        with open(stat) as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                break
        time.sleep(0.05)
    for _ in range(50):
        procs[1].send_signal(signal.SIGCONT)
        time.sleep(0.002)
        procs[1].send_signal(signal.SIGSTOP)
        time.sleep(0.018)
    procs[1].kill()


@pytest.mark.parametrize("how", ["exception", "killed", "stopped"])
def test_a_rank_that_ends_fails_the_others(how):
    procs, outs = two_processes("crash", how,
                                on_start=kill_once_stopped if how == "stopped" else None)
    assert procs[0].returncode == 0 and "reaches rank 0 ok" in outs[0], "\n".join(outs)
    assert procs[1].returncode != 0, outs[1]
    print(outs[0])


def test_a_communicator_dropped_at_exit_ends_cleanly():
    # A waiting thread woken while the interpreter exits aborted the process ("terminate called
    # without an active exception") in 4 of 60 processes; 6 launches of 2.
    for _ in range(6):
        procs, outs = two_processes("exit")
        for r in range(2):
            assert procs[r].returncode == 0 and f"rank {r}: exit after a ring ok" in outs[r], \
                "\n".join(outs)


def test_a_timeout_reaches_the_late_rank():
    procs, outs = two_processes("late")
    for r in range(2):
        assert procs[r].returncode == 0 and f"rank {r}: a late rank ok" in outs[r], \
            "\n".join(outs)
    print("".join(outs))


def test_torch_comm_without_a_process_group_says_what_to_do():
    env = {k: v for k, v in rank_env().items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    r = subprocess.run([sys.executable, "-c", "import torch, seqpar\n"
                        "try:\n    seqpar.TorchComm()\nexcept ValueError as e:\n    print(e)"],
                       env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    assert r.returncode == 0 and r.stdout.strip() == (
        "TorchComm: torch.distributed is not initialized; call "
        "torch.distributed.init_process_group(\"gloo\") first or launch with torchrun"), \
        r.stdout + r.stderr
