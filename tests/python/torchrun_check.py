"""Run by test_torchrun.py on the ranks of a torch.distributed job (torchrun, or processes started
with its environment). One scenario per launch, named by argv[1]:

  main CASES.json   (4 ranks) seqpar.attention and decode_attention over seqpar.TorchComm against
                    PyTorch's SDPA on the unsharded tensors; CommStats against the threads
                    backend's for the same calls; CausalLM generating transformers' tokens;
                    WanTransformer predicting diffusers' noise.
  refuse            (2 ranks) MpiComm() refuses a torchrun world; then rank 1 announces a failure
                    with comm.abort and stays alive while rank 0 waits in a collective.
  crash HOW         (2 ranks) rank 1 ends while rank 0 waits: an uncaught exception
                    ("exception"), SIGKILL in the middle of a ring attention ("killed"), or
                    SIGSTOP there, then SIGKILL from the test while stopped ("stopped": its
                    messages are then in flight, which gloo alone never ends).
  late              (2 ranks) rank 1 arrives after rank 0's deadline: a timeout on rank 0, its
                    announcement on rank 1.
  exit              (2 ranks) a ring through a TorchComm dropped just before the script exits
                    (its waiting thread then ends while the interpreter exits).

Every rank prints "rank R: <case> ... ok" or "... FAILED" per check and exits 1 on a failure.
"""

import datetime
import json
import os
import signal
import sys
import threading

import torch
import torch.nn.functional as F

from module_env import TOL_BF16, TOL_F32, qkv

import seqpar

# Measured here against SDPA in float64 (4 ranks): fp32 attention 7.8e-7, decode 2.4e-7, bf16
# 4.9e-3; the bounds are module_env's (2e-6, 8e-3).
failed = 0


def report(rank, name, ok, detail=""):
    global failed
    failed += not ok
    # one write per line: the ranks share the launcher's pipe
    say(" ".join(x for x in (f"rank {rank}: {name}", detail, "ok" if ok else "FAILED") if x))


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def sdpa(q, k, v, causal=False, mask=None):
    """PyTorch's scaled_dot_product_attention in float64 on (B, S, H, D) tensors, GQA expanded by
    SDPA itself."""
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                         enable_gqa=True)
    return out.transpose(1, 2)


ATTENTION_CASES = [  # strategy, layout, tokens, extra keywords
    ("ring", "contiguous", 72, {}),
    ("ring", "zigzag", 72, {}),
    ("allgather", "striped", 72, {}),
    ("ulysses", "contiguous", 72, {}),
    ("ulysses", "zigzag", 72, {}),
    ("usp", "zigzag", 72, {"ulysses_degree": 2}),
    ("allgather", "contiguous", 70, {}),  # uneven shards: all_gatherv of unequal counts
    ("ulysses", "contiguous", 70, {}),    # all_to_allv of unequal counts
]
DECODE_CASES = [("passq", "default"), ("passq", "ring"), ("passkv", "default")]


def stats_of(comm):
    return {op: list(sr) for op, sr in comm.last_stats.bytes_by_op.items()}


def attention_cases(comm, calls):
    """Every case on this rank; records (kind, args) of each call for the threads backend."""
    n, r = comm.size, comm.rank
    errors = {"fp32": [0.0], "bf16": [0.0], "decode": [0.0]}
    for dtype, tol in ((torch.float32, TOL_F32), (torch.bfloat16, TOL_BF16)):
        for strategy, layout, S, extra in ATTENTION_CASES:
            if dtype != torch.float32 and strategy != "ring":
                continue
            q, k, v = qkv(2, S, 4, 2, 16, dtype=dtype)  # GQA: 4 heads over 2 kv heads
            for causal in (False, True):
                part = seqpar.Partition(S, n, layout)
                x = [part.shard(t, r) for t in (q, k, v)]
                out = seqpar.attention(*x, comm=comm, strategy=strategy, layout=layout,
                                       causal=causal, **extra)
                want = part.shard(sdpa(q, k, v, causal=causal), r)
                err = (out.double() - want).abs().max().item()
                errors["fp32" if dtype == torch.float32 else "bf16"].append(err)
                report(r, f"attention {strategy} {layout} causal={causal} {dtype}",
                       out.dtype == dtype and err <= tol, f"max err {err:.2e}")
                calls.append(("attention", dict(strategy=strategy, layout=layout, causal=causal,
                                                dtype=str(dtype), seq=S, **extra),
                              stats_of(comm)))
    # decode: the ranks' cache rows in rank order are the sequence, their queries its newest.
    P, T = 72, 8
    q, k, v = qkv(2, P, 4, 2, 16, seed=1)
    qn = q[:, P - T:]
    pos = torch.arange(P)
    mask = pos[None, :] <= (P - T + torch.arange(T))[:, None]
    want = sdpa(qn, k, v, mask=mask)
    cp, tq = P // n, T // n
    for strategy, schedule in DECODE_CASES:
        out = seqpar.decode_attention(qn[:, r * tq:(r + 1) * tq].contiguous(),
                                      k[:, r * cp:(r + 1) * cp].contiguous(),
                                      v[:, r * cp:(r + 1) * cp].contiguous(), comm=comm,
                                      strategy=strategy, schedule=schedule)
        err = (out.double() - want[:, r * tq:(r + 1) * tq]).abs().max().item()
        errors["decode"].append(err)
        report(r, f"decode_attention {strategy} {schedule}", err <= TOL_F32, f"max err {err:.2e}")
        calls.append(("decode", dict(strategy=strategy, schedule=schedule), stats_of(comm)))
    return {kind: max(e) for kind, e in errors.items()}


def same_call_on_threads(n, kind, args):
    """CommStats bytes of every rank for the same call on the threads backend."""
    def rank_fn(comm):
        r = comm.rank
        if kind == "attention":
            a = dict(args)
            dtype = torch.bfloat16 if a.pop("dtype") == "torch.bfloat16" else torch.float32
            S = a.pop("seq")
            q, k, v = qkv(2, S, 4, 2, 16, dtype=dtype)
            part = seqpar.Partition(S, n, a["layout"])
            seqpar.attention(*[part.shard(t, r) for t in (q, k, v)], comm=comm, **a)
        else:
            P, T = 72, 8
            q, k, v = qkv(2, P, 4, 2, 16, seed=1)
            cp, tq = P // n, T // n
            seqpar.decode_attention(q[:, P - T + r * tq:P - T + (r + 1) * tq].contiguous(),
                                    k[:, r * cp:(r + 1) * cp].contiguous(),
                                    v[:, r * cp:(r + 1) * cp].contiguous(), comm=comm, **args)
        return stats_of(comm)
    return seqpar.ThreadWorld(n, threads=1).run(rank_fn)


def main(cases_file):
    import torch.distributed as dist

    with open(cases_file) as f:
        spec = json.load(f)
    comm = seqpar.TorchComm()
    r, n = comm.rank, comm.size
    report(r, "TorchComm world", comm.size == int(os.environ["WORLD_SIZE"]) and
           comm.rank == int(os.environ["RANK"]) and comm.backend == "torch",
           f"size {comm.size} backend {comm.backend}")

    calls = []
    worst = attention_cases(comm, calls)

    # CommStats: every rank's bytes per op equal the threads backend's for the same call.
    mine = [c[2] for c in calls]
    everyone = [None] * n
    dist.all_gather_object(everyone, mine)
    if r == 0:
        for i, (kind, args, _) in enumerate(calls):
            threads = same_call_on_threads(n, kind, args)
            torch_side = [everyone[j][i] for j in range(n)]
            report(r, f"CommStats {kind} {args}", threads == torch_side,
                   f"torch {torch_side[0]} threads {threads[0]}")

    # A model through the torch comm: tokens equal transformers' (computed by the test).
    for mesh in spec["meshes"]:
        model = seqpar.CausalLM.from_pretrained(spec["path"], comm=comm, **mesh)
        tokens = model.generate(spec["prompt"], len(spec["tokens"])).tolist()
        report(r, f"CausalLM {mesh}", tokens == spec["tokens"], f"tokens {tokens}")
    # WanTransformer through the torch comm: diffusers' noise prediction (test_wan.py's bound).
    io = torch.load(spec["wan"]["io"])
    wan = seqpar.WanTransformer.from_pretrained(spec["wan"]["path"], comm=comm, tp=2,
                                                ring_degree=2)
    out = wan.forward(io["x"], torch.tensor([737.0]), io["text"])
    err = float((out - io["cond"]).abs().max() / io["cond"].abs().max())
    report(r, "WanTransformer tp 2 ring 2", err <= 1e-4, f"relative error {err:.2e}")
    comm.barrier()
    say(f"SUMMARY {r} {json.dumps(dict(max_err=worst))}")


def refuse():
    r = int(os.environ["RANK"])
    try:
        seqpar.MpiComm()
        report(r, "MpiComm refused", False, "MpiComm() under torchrun was accepted")
    except ValueError as e:
        text = str(e)
        say(f"rank {r}: MpiComm says: {text}")
        report(r, "MpiComm refused", "\n" not in text and "WORLD_SIZE=2" in text and
               "MPI's world has 1" in text and "seqpar.TorchComm()" in text)
    comm = seqpar.TorchComm()
    q, k, v = qkv(1, 32, 2, 2, 16)
    part = seqpar.Partition(32, 2)
    x = [part.shard(t, r) for t in (q, k, v)]
    seqpar.attention(*x, comm=comm, strategy="ring")  # the world works
    store = torch.distributed.distributed_c10d._get_default_store()
    if r == 1:
        comm.abort("injected failure on rank 1")
        # alive until rank 0 is done: it learns of the failure from the store, not a closed socket
        store.wait(["rank 0 done"], datetime.timedelta(seconds=120))
        return
    try:
        seqpar.attention(*x, comm=comm, strategy="allgather")
        report(r, "abort reaches rank 0", False, "the call returned")
    except seqpar.CommError as e:
        say(f"rank {r}: CommError: {e}")
        report(r, "abort reaches rank 0", "rank 1 failed: injected failure on rank 1" in str(e))
    store.set("rank 0 done", "1")
    os._exit(1 if failed else 0)  # without the store's teardown


def late():
    """Rank 1 arrives at a call only after rank 0, waiting in it with a 1 s deadline, has raised
    CommTimeout (rank 0 says so through the store, so no sleep decides the order); rank 1 then
    fails with rank 0's announced timeout (read from the store rank 0 keeps)."""
    comm = seqpar.TorchComm()
    r = comm.rank
    x = [seqpar.Partition(32, 2).shard(t, r) for t in qkv(1, 32, 2, 2, 16)]
    seqpar.attention(*x, comm=comm, strategy="ring")  # the world works
    comm.set_timeout(1.0 if r == 0 else 100.0)
    store = torch.distributed.distributed_c10d._get_default_store()
    if r == 1:
        store.wait(["late: rank 0 timed out"], datetime.timedelta(seconds=120))
    try:
        seqpar.attention(*x, comm=comm, strategy="ring")
        report(r, "a late rank", False, "the call returned")
    except seqpar.CommError as e:
        say(f"rank {r}: {type(e).__name__}: {e}")
        want = ("timeout after 1 s: rank 0 waiting for" if r == 0 else
                "rank 0 failed: timeout after 1 s: rank 0 waiting for")
        report(r, "a late rank", want in str(e) and isinstance(e, seqpar.CommTimeout) == (r == 0))
    # Rank 0 hosts the store (plain processes): it stays until rank 1 has read the announcement.
    if r == 0:
        store.set("late: rank 0 timed out", "1")
    if r == 1:
        store.set("late: rank 1 done", "1")
    else:
        store.wait(["late: rank 1 done"], datetime.timedelta(seconds=120))


def crash(how):
    """Rank 1 ends mid-job: "exception" raises uncaught (announced by TorchComm's excepthook,
    then the process exits) while rank 0 waits in a collective; "killed" dies by SIGKILL in the
    middle of a long ring attention (nothing announced; gloo closes its connections); "stopped"
    stops itself there for the test to kill."""
    comm = seqpar.TorchComm()
    r = comm.rank
    small = [seqpar.Partition(32, 2).shard(t, r) for t in qkv(1, 32, 2, 2, 16)]
    seqpar.attention(*small, comm=comm, strategy="ring")  # the world works
    # killed, stopped: calls that mostly move K/V (8 MB a message, 1 flop a byte), so rank 1
    # likely ends with messages in flight
    S, H, D, calls = (32, 2, 16, 20) if how == "exception" else (4, 4096, 256, 2000)
    part = seqpar.Partition(S, 2)
    x = [part.shard(t, r) for t in qkv(1, S, H, H, D)]
    # The order of events is said through the store, never left to a sleep or a timer.
    store = torch.distributed.distributed_c10d._get_default_store()
    if r == 0 and how == "exception":
        store.set("crash: rank 0 calls", "1")
    if r == 1 and how == "exception":
        store.wait(["crash: rank 0 calls"], datetime.timedelta(seconds=120))
        raise RuntimeError("injected failure on rank 1")
    # killed, stopped: at its 10th call rank 1 signals itself from a second thread while the
    # call's transfers run.
    sig = signal.SIGKILL if how == "killed" else signal.SIGSTOP
    try:
        for i in range(calls):
            if r == 1 and i == 10:
                threading.Thread(target=os.kill, args=(os.getpid(), sig)).start()
            seqpar.attention(*x, comm=comm, strategy="allgather" if how == "exception" else "ring")
        report(r, f"rank 1 {how} reaches rank 0", False, "the calls returned")
    except seqpar.CommError as e:
        say(f"rank {r}: CommError: {e}")
        # killed, stopped: gloo's "Connection closed by peer" or "Connection reset by peer"
        want = ("rank 1 failed: RuntimeError: injected failure on rank 1" if how == "exception"
                else "by peer")
        report(r, f"rank 1 {how} reaches rank 0", want in str(e))


def exit_after_ring():
    def ring():
        comm = seqpar.TorchComm()
        part = seqpar.Partition(64, 2)
        q, k, v = qkv(1, 64, 2, 2, 16)
        x = [part.shard(t, comm.rank) for t in (q, k, v)]
        want = part.shard(sdpa(q, k, v), comm.rank)
        err = max((seqpar.attention(*x, comm=comm, strategy="ring").double() - want).abs().max()
                  .item() for _ in range(3))
        return comm.rank, err

    r, err = ring()
    report(r, "exit after a ring", err <= TOL_F32)


if __name__ == "__main__":
    {"main": lambda: main(sys.argv[2]), "refuse": refuse,
     "crash": lambda: crash(sys.argv[2]), "late": late, "exit": exit_after_ring}[sys.argv[1]]()
    sys.exit(1 if failed else 0)
