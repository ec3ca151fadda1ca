"""seqpar's Python module on ranks as threads: every strategy against PyTorch's
softmax(q kᵀ/√d) v on the unsharded tensors, dtypes, the no-copy contract, stats, errors."""

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from module_env import TOL_BF16, TOL_F16, TOL_F32, qkv, reference, torch

import seqpar


B, S, H, HKV, D = 2, 96, 4, 2, 16


def run_sharded(n, layout, fn, full, **kwargs):
    """Shards `full` tensors by Partition(S, n, layout), runs fn(comm, *shards) on n thread
    ranks, unshards the outputs."""
    part = seqpar.Partition(full[0].shape[1], n, layout)

    def rank(comm):
        shards = [part.shard(t, comm.rank) for t in full]
        return fn(comm, *shards, **kwargs)

    return part.unshard(seqpar.ThreadWorld(n, threads=1).run(rank)), part


STRATEGIES = [  # (strategy, ranks, extra keywords)
    ("ring", 2, {}),
    ("ring", 4, {}),
    ("allgather", 3, {}),
    ("ulysses", 2, {}),
    ("ulysses", 4, {"ulysses_mode": "uaa"}),
    ("usp", 4, {"ulysses_degree": 2, "ring_degree": 2}),
]


@pytest.mark.parametrize("strategy,n,extra", STRATEGIES)
@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
@pytest.mark.parametrize("causal", [False, True])
def test_every_strategy_matches_pytorch(strategy, n, extra, layout, causal):
    q, k, v = qkv(B, S, H, HKV, D)
    out, _ = run_sharded(n, layout, lambda comm, *t: seqpar.attention(
        *t, comm=comm, strategy=strategy, layout=layout, causal=causal, **extra), (q, k, v))
    want, _ = reference(q, k, v, causal=causal)
    assert out.dtype == torch.float32 and out.shape == q.shape
    assert (out.double() - want).abs().max().item() < TOL_F32


DOCS = [300, 17, 1, 90, 211, 5]  # lengths 1 and 5, none dividing the ranks, 300 over every rank


@pytest.mark.parametrize("strategy,n,extra", STRATEGIES)
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_packed_documents_match_pytorch(strategy, n, extra, layout):
    """seq_lens (varlen): every strategy against PyTorch's attention with the document mask."""
    seq = sum(DOCS)
    q, k, v = qkv(1, seq, H, HKV, D, seed=3)
    part = seqpar.Partition(seq, n, layout, seq_lens=DOCS)

    def rank(comm):
        shards = [part.shard(t, comm.rank) for t in (q, k, v)]
        return seqpar.attention(*shards, comm=comm, strategy=strategy, layout=layout, causal=True,
                                seq_lens=DOCS, **extra)

    out = part.unshard(seqpar.ThreadWorld(n, threads=1).run(rank))
    want, _ = reference(q, k, v, causal=True, seq_lens=DOCS)
    assert (out.double() - want).abs().max().item() < TOL_F32


def test_steal_schedule_and_ring_pass_q():
    """schedule="steal" on contiguous shards and pass_="q-ring" over a cache, against PyTorch."""
    q, k, v = qkv(B, S, H, HKV, D, seed=4)
    out, _ = run_sharded(4, "contiguous", lambda comm, *t: seqpar.attention(
        *t, comm=comm, causal=True, schedule="steal"), (q, k, v))
    want, _ = reference(q, k, v, causal=True)
    assert (out.double() - want).abs().max().item() < TOL_F32
    with pytest.raises(ValueError, match="schedule 'steal' does not apply to strategy 'ulysses'"):
        seqpar.ThreadWorld(2).run(lambda comm: seqpar.attention(
            *[t[:, :S // 2] for t in (q, k, v)], comm=comm, strategy="ulysses",
            schedule="steal"))
    with pytest.raises(ValueError, match="seq_lens sum to 10 but the ranks hold"):
        seqpar.ThreadWorld(2).run(lambda comm: seqpar.attention(
            *[t[:, :S // 2] for t in (q, k, v)], comm=comm, seq_lens=[4, 6]))


def test_lse_and_const_max_softmax():
    q, k, v = qkv(1, 64, 4, 4, 16, seed=1)

    def fn(comm, q, k, v):
        out, lse = seqpar.attention(q, k, v, comm=comm, causal=True, softmax="const-max",
                                    return_lse=True)
        return torch.cat([out.flatten(2), lse], dim=2)

    got, _ = run_sharded(2, "contiguous", fn, (q, k, v))
    want, want_lse = reference(q, k, v, causal=True)
    assert (got[..., :64].double() - want.flatten(2)).abs().max().item() < TOL_F32
    assert (got[..., 64:].double() - want_lse).abs().max().item() < TOL_F32


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, TOL_BF16), (torch.float16, TOL_F16)])
def test_half_precision_in_and_out(dtype, tol):
    q, k, v = qkv(B, S, H, HKV, D, dtype=dtype, seed=2)
    out, _ = run_sharded(2, "zigzag", lambda comm, *t: seqpar.attention(
        *t, comm=comm, layout="zigzag", causal=True), (q, k, v))
    want, _ = reference(q, k, v, causal=True)  # the same rounded inputs, in float64
    assert out.dtype == dtype
    assert (out.double() - want).abs().max().item() < tol


# Ulysses sends the output back in the dtype it is returned in: a bf16 or fp16 call's second
# all-to-all carries D·2 bytes per row and head, plus the fp32 lse it returns, where an fp32 call
# carries D·4 + 4; the result is PyTorch's.
@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, TOL_BF16), (torch.float16, TOL_F16)])
@pytest.mark.parametrize("strategy", ["ulysses", "usp"])
def test_ulysses_sends_the_output_in_its_dtype(dtype, tol, strategy):
    n, heads = 4, 8
    q, k, v = qkv(B, S, heads, heads, D, dtype=dtype, seed=5)
    deg = {"ulysses_degree": 2} if strategy == "usp" else {}

    def fn(comm, *t):
        out = seqpar.attention(*t, comm=comm, strategy=strategy, layout="zigzag", causal=True,
                               **deg)
        return out, comm.last_stats.bytes_by_op["all_to_all"][0]

    part = seqpar.Partition(S, n, "zigzag")
    results = seqpar.ThreadWorld(n).run(
        lambda comm: fn(comm, *(part.shard(t, comm.rank) for t in (q, k, v))))
    out = part.unshard([r[0] for r in results])
    want, _ = reference(q, k, v, causal=True)
    assert out.dtype == dtype
    assert (out.double() - want).abs().max().item() < tol
    u = 2 if strategy == "usp" else n
    rows = S // n  # this member's tokens; each of the other u - 1 members holds heads / u heads
    qkv_bytes = (u - 1) * B * rows * (3 * heads // u) * D * 2
    back = (u - 1) * B * rows * (heads // u) * (D * 2 + 4)
    assert {r[1] for r in results} == {qkv_bytes + back}


def test_numpy_in_numpy_out():
    q, k, v = (t.numpy() for t in qkv(1, 40, 2, 2, 8, seed=3))
    out, _ = run_sharded(2, "contiguous", lambda comm, *t: seqpar.attention(
        *t, comm=comm, strategy="allgather"), (q, k, v))
    want, _ = reference(*(torch.from_numpy(t) for t in (q, k, v)))
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    assert np.abs(out - want.numpy()).max() < TOL_F32
    out16, _ = run_sharded(2, "contiguous", lambda comm, *t: seqpar.attention(*t, comm=comm),
                           tuple(t.astype(np.float16) for t in (q, k, v)))
    assert out16.dtype == np.float16


def test_uneven_contiguous_shards_and_padding():
    q, k, v = qkv(1, 50, 2, 1, 8, seed=4)
    counts = [13, 30, 7]

    def uneven(comm):
        lo = sum(counts[:comm.rank])
        sl = slice(lo, lo + counts[comm.rank])
        return seqpar.attention(q[:, sl], k[:, sl], v[:, sl], comm=comm, causal=True)

    out = torch.cat(seqpar.ThreadWorld(3).run(uneven), dim=1)
    want, _ = reference(q, k, v, causal=True)
    assert (out.double() - want).abs().max().item() < TOL_F32

    # 50 real tokens padded to 52 over 4 ranks: the padded keys are masked.
    qp, kp, vp = (torch.cat([t, torch.zeros(1, 2, *t.shape[2:])], dim=1) for t in (q, k, v))
    out, _ = run_sharded(4, "zigzag", lambda comm, *t: seqpar.attention(
        *t, comm=comm, layout="zigzag", pad=True, seq_len=50), (qp, kp, vp))
    want, _ = reference(q, k, v)
    assert (out[:, :50].double() - want).abs().max().item() < TOL_F32


@pytest.mark.parametrize("dtype,tol", [(torch.float32, TOL_F32), (torch.bfloat16, TOL_BF16)])
def test_joint_attention_with_replicated_text(dtype, tol):
    """The text rows of a batch of 2 (rows apart in memory) read and written in place."""
    T = 6
    q, k, v = qkv(2, 32, 2, 2, 8, dtype=dtype, seed=5)
    tq, tk, tv = qkv(2, T, 2, 2, 8, dtype=dtype, seed=6)
    part = seqpar.Partition(32, 2)

    def rank(comm):
        x = [torch.cat([part.shard(a, comm.rank), b], dim=1) for a, b in ((q, tq), (k, tk), (v, tv))]
        return seqpar.attention(*x, comm=comm, strategy="ulysses", text_tokens=T)

    outs = seqpar.ThreadWorld(2).run(rank)
    want, _ = reference(*(torch.cat([a, b], dim=1) for a, b in ((q, tq), (k, tk), (v, tv))))
    image = part.unshard([o[:, :-T] for o in outs])
    assert image.dtype == dtype
    assert (image.double() - want[:, :32]).abs().max().item() < tol
    for o in outs:
        assert (o[:, -T:].double() - want[:, 32:]).abs().max().item() < tol


@pytest.mark.parametrize("strategy,n", [("ring", 1), ("ring", 2), ("allgather", 3),
                                        ("ulysses", 2)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, TOL_F32), (torch.bfloat16, TOL_BF16)])
def test_strided_inputs_are_read_where_they_lie(strategy, n, dtype, tol):
    """PyTorch's own (B, H, S, D) layout passed as .transpose(1, 2), and q, k, v as head slices of
    one fused projection: no .contiguous() on the caller's side, the result PyTorch's."""
    q, k, v = qkv(B, S, H, HKV, D, dtype=dtype, seed=12)
    head_first = tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    fused = torch.cat([q, k, v], dim=2)  # (B, S, H + 2·HKV, D)
    sliced = (fused[:, :, :H], fused[:, :, H:H + HKV], fused[:, :, H + HKV:])
    want, _ = reference(q, k, v, causal=True)
    for x in (head_first, sliced):
        assert not any(t.is_contiguous() for t in x)
        out, _ = run_sharded(n, "contiguous", lambda comm, *t: seqpar.attention(
            *t, comm=comm, strategy=strategy, causal=True), x)
        assert out.dtype == dtype and out.shape == q.shape
        assert (out.double() - want).abs().max().item() < tol


@pytest.mark.parametrize("pass_", ["q", "q-ring", "kv", "auto"])
def test_decode_attention(pass_):
    P, T = 40, 3  # cache of 40 tokens (the last 3 are the new ones), 3 queries
    q_all, _, _ = qkv(1, T, 4, 2, 8, seed=7)
    _, k, v = qkv(1, P, 4, 2, 8, seed=8)
    kv_counts, q_counts = [15, 15, 10], [0, 1, 2]

    def rank(comm):
        lo = sum(kv_counts[:comm.rank])
        qlo = sum(q_counts[:comm.rank])
        return seqpar.decode_attention(q_all[:, qlo:qlo + q_counts[comm.rank]],
                                       k[:, lo:lo + kv_counts[comm.rank]],
                                       v[:, lo:lo + kv_counts[comm.rank]], comm=comm,
                                       pass_=pass_), comm.last_pass, comm.last_stats.bytes_by_op

    results = seqpar.ThreadWorld(3).run(rank)
    out = torch.cat([r[0] for r in results], dim=1)
    want, _ = reference(q_all, k, v, causal=True, q_pos=range(P - T, P))
    assert (out.double() - want).abs().max().item() < TOL_F32
    if pass_ != "auto":
        assert {r[1] for r in results} == {pass_}
    # The ring of Q blocks moves them by send_recv; all-gathered queries by all_gatherv.
    ring = pass_ == "q-ring"
    assert all(("send_recv" in r[2]) == (ring or r[1] == "kv") for r in results), results


def test_contiguous_inputs_are_not_copied():
    q, k, v = qkv(2, 64, 2, 2, 16, seed=9)
    part = seqpar.Partition(64, 2)

    def rank(comm):
        x = [part.shard(t, comm.rank) for t in (q, k, v)]
        out = seqpar.attention(*x, comm=comm)
        read = comm.last_stats.input_addresses
        # The same values stored [S, B, H, D] and viewed [B, S, H, D]: handed to the strategy
        # where they lie (the ring packs k and v once for the wire), and the result is the same.
        sbhd = [t.transpose(0, 1).contiguous().transpose(0, 1) for t in x]
        out2 = seqpar.attention(*sbhd, comm=comm)
        return (read, tuple(t.data_ptr() for t in x), comm.last_stats.input_addresses,
                tuple(t.data_ptr() for t in sbhd), torch.equal(out, out2))

    for read, given, read_sbhd, given_sbhd, same in seqpar.ThreadWorld(2).run(rank):
        assert read == given  # computed from the caller's memory
        assert read_sbhd == given_sbhd
        assert same


def test_numpy_inputs_are_not_copied_and_fp32_output_is_shared():
    q, k, v = (t.numpy() for t in qkv(1, 32, 2, 2, 8, seed=10))

    def rank(comm):
        sl = slice(16 * comm.rank, 16 * comm.rank + 16)
        x = [np.ascontiguousarray(t[:, sl]) for t in (q, k, v)]
        out = seqpar.attention(*x, comm=comm)
        return comm.last_stats.input_addresses, tuple(t.ctypes.data for t in x), out.flags.owndata

    for read, given, owns in seqpar.ThreadWorld(2).run(rank):
        assert read == given
        assert not owns  # the array is a view of seqpar's result buffer, not a copy of it


def test_stats_report_the_ring_bytes():
    q, k, v = qkv(B, S, H, HKV, D, seed=11)
    part = seqpar.Partition(S, 2)

    def rank(comm):
        seqpar.attention(*(part.shard(t, comm.rank) for t in (q, k, v)), comm=comm)
        return comm.last_stats

    stats = seqpar.ThreadWorld(2).run(rank)
    # ring: rank r receives the other rank's K and V once: 2·B·(S - n_r)·Hkv·D·4 bytes.
    for r, st in enumerate(stats):
        assert st.bytes_recv == 2 * B * (S - part.count(r)) * HKV * D * 4
        assert st.bytes_sent == 2 * B * (S - part.count(1 - r)) * HKV * D * 4
        assert st.bytes_by_op["send_recv"] == (st.bytes_sent, st.bytes_recv)
        # (its seconds and exposed-communication fraction are clock readings: for the benchmarks,
        # not judged here)
        assert st.work > 0


def test_bad_arguments_raise_value_error_with_the_library_message():
    q, k, v = qkv(1, 8, 2, 2, 4)
    cases = [
        (dict(strategy="bogus"), "strategy 'bogus' is unknown; valid: local, allgather, ring, ulysses, usp, passkv, passq"),
        (dict(layout="diagonal"), "layout 'diagonal' is unknown; valid: contiguous, striped, zigzag"),
        (dict(softmax="const-max", strategy="allgather"), "const-max"),
        (dict(strategy="ring", ulysses_degree=2), "use strategy usp"),
        (dict(pad=True), "pad=True needs seq_len"),
    ]
    for kwargs, message in cases:
        def rank(comm, kwargs=kwargs):
            seqpar.attention(q, k, v, comm=comm, **kwargs)
        with pytest.raises(ValueError, match=None) as e:
            seqpar.ThreadWorld(1).run(rank)
        assert message in str(e.value), (kwargs, str(e.value))
        assert "--" not in str(e.value)  # the library's words, not the command line's
    with pytest.raises(ValueError, match="dtype torch.float64"):
        seqpar.ThreadWorld(1).run(lambda comm: seqpar.attention(q.double(), k, v, comm=comm))
    with pytest.raises(ValueError, match="divisible"):
        seqpar.ThreadWorld(1).run(lambda comm: seqpar.attention(q, k[:, :, :1].repeat(1, 1, 3, 1),
                                                               v[:, :, :1].repeat(1, 1, 3, 1),
                                                               comm=comm))


def test_rank_failure_and_timeout():
    q, k, v = qkv(1, 8, 2, 2, 4)

    def one_fails(comm):
        if comm.rank == 1:
            raise KeyError("rank one gives up")
        seqpar.attention(q, k, v, comm=comm)

    with pytest.raises(KeyError, match="rank one gives up"):  # the first failure, as raised
        seqpar.ThreadWorld(2).run(one_fails)

    def one_absent(comm):
        if comm.rank == 0:
            seqpar.attention(q, k, v, comm=comm)

    with pytest.raises(seqpar.CommTimeout) as e:
        seqpar.ThreadWorld(2, timeout=0.3).run(one_absent)
    assert isinstance(e.value, RuntimeError) and isinstance(e.value, TimeoutError)
    assert "timeout after" in str(e.value)


def test_comm_outside_run_is_closed():
    comm = seqpar.ThreadWorld(1).run(lambda c: c)[0]
    with pytest.raises(RuntimeError, match="valid only inside run"):
        comm.rank


def test_partition_and_mesh():
    part = seqpar.Partition(10, 2, "zigzag")
    assert [list(part.positions(r)) for r in range(2)] == [[0, 1, 2, 8, 9], [3, 4, 5, 6, 7]]
    x = torch.arange(20.).reshape(1, 10, 2, 1)
    assert torch.equal(part.unshard([part.shard(x, r) for r in range(2)]), x)
    xn = x.numpy()
    assert np.array_equal(part.unshard([part.shard(xn, r) for r in range(2)]), xn)
    with pytest.raises(ValueError, match="layout 'diagonal' is unknown"):
        seqpar.Partition(10, 2, "diagonal")
    # Bounds as the CLI's, before anything grows; document lengths checked in every layout.
    with pytest.raises(ValueError, match=r"^seq 8589934592 is out of range; valid: 1 to"):
        seqpar.Partition(2**33, 2)
    with pytest.raises(ValueError, match=r"^ranks 131072 is out of range; valid: 1 to 65536"):
        seqpar.Partition(10, 2**17)
    with open("/proc/meminfo") as f:
        available = next(int(line.split()[1]) * 1024 for line in f
                         if line.startswith("MemAvailable:"))
    if available < 103e9:  # else the machine holds the positions
        with pytest.raises(ValueError, match=r"^Partition of 4294967296 tokens \(their "
                           r"positions\) needs about 103 GB of memory but this machine has"):
            seqpar.Partition(2**32, 2)
    for layout in ("contiguous", "zigzag"):
        with pytest.raises(ValueError, match=r"^seq_lens sum to 11, more than seq 10"):
            seqpar.Partition(10, 2, layout, seq_lens=[5, 6])
        with pytest.raises(ValueError, match=r"^seq_lens\[1\] = -5 is invalid"):
            seqpar.Partition(10, 2, layout, seq_lens=[5, -5, 10])

    rows = seqpar.Mesh(tp=4, ring_degree=8).rows(heads=40, seq=1024)
    assert rows[8] == {"rank": 8, "cfg_rank": 0, "tp_rank": 1, "ulysses_rank": 0, "ring_rank": 0,
                       "cp_rank": 0, "heads": [10, 20], "tokens": [0, 128]}
    cli = subprocess.run([os.environ["SEQPAR_BIN"], "mesh", "--tp", "4", "--ring-degree", "8",
                          "--heads", "40", "--seq", "1024", "--json"],
                         capture_output=True, text=True, check=True)
    assert json.loads(cli.stdout) == rows
    with pytest.raises(ValueError):
        seqpar.Mesh(tp=3).rows(heads=40, seq=16)


def test_readme_example():
    """The README's "Use it from Python" block runs as it stands."""
    readme = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
    text = open(readme).read().split("## Use it from Python", 1)[1]
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(block, "README.md", "exec"), {})


def test_plan_is_the_cli_json():
    args = dict(model="wan2.1-t2v-14b", height=240, width=432, frames=33, ranks=8)
    got = seqpar.plan(**args)
    cli = subprocess.run([os.environ["SEQPAR_BIN"], "plan", "--model", "wan2.1-t2v-14b",
                          "--height", "240", "--width", "432", "--frames", "33", "--ranks", "8",
                          "--json"], capture_output=True, text=True, check=True)
    assert got == json.loads(cli.stdout)
    assert got["seq_len"] == 3645 and got["remainder"] == 5 and got["meshes"]
    bare = seqpar.plan(seq=16384, heads=8, ranks=4, causal=True, hardware="cpu-ethernet")
    assert bare["family"] == "attention" and bare["seq_len"] == 16384
    const_max = seqpar.plan(seq=16384, heads=8, ranks=4, causal=True, softmax="const-max")
    assert const_max["meshes"] and all(m["softmax"] == "const-max" for m in const_max["meshes"])
    with pytest.raises(ValueError, match="model 'wan2.1-14b' is unknown; nearest: wan2.1-t2v-14b"):
        seqpar.plan(model="wan2.1-14b", height=240, width=432, frames=33)


def test_plan_takes_the_flags_of_seqpar_plan():
    """Every flag of `seqpar plan` is a keyword of seqpar.plan, by its underscore name; the
    negated flags are the keywords' False (guidance, pad); the outputs (json, svg) and the
    simulation are the CLI's."""
    import inspect
    import re
    help_text = subprocess.run([os.environ["SEQPAR_BIN"], "plan", "--help"], capture_output=True,
                               text=True, check=True).stdout
    flags = set()
    for names in re.findall(r"^  (-[-\w,]+)", help_text, re.M):
        flags.update(n.lstrip("-").replace("-", "_") for n in names.split(","))
    flags -= {"h", "help", "json", "svg", "simulate", "sim_ranks", "no_guidance", "no_pad"}
    flags.add("guidance")
    keywords = set(inspect.signature(seqpar.plan).parameters)
    keywords.discard("memory_limit_gb")
    flags.discard("memory_limit")
    assert flags <= keywords, flags - keywords
    pinned = seqpar.plan(seq=16384, heads=8, ranks=8, causal=True, sequence_parallel_size=8,
                         tensor_parallel_size=1, cfg_parallel_size=1, schedule="steal",
                         hardware="cpu-ethernet")
    assert pinned["meshes"] and all(m["schedule"] == "steal" and m["sequence_parallel_size"] == 8
                                    for m in pinned["meshes"])


def test_gil_is_released_while_computing():
    """Another Python thread runs while a rank is inside an attention call. The interpreter's
    switch interval is made longer than the test, so a thread holding the GIL never hands it over
    on its own. Rank 1 enters its call only once rank 0 is about to enter its own (an event rank 0
    sets just before, which rank 1 waits on, in Python); rank 0's ring needs rank 1's K/V, so the
    run completes only if rank 0's call let rank 1 take the GIL (held: rank 0's call times out).
    The result is judged against PyTorch."""
    q, k, v = qkv(1, 512, 4, 4, 64, seed=12)
    part = seqpar.Partition(512, 2)
    entering = threading.Event()

    def rank(comm):
        shards = [part.shard(t, comm.rank) for t in (q, k, v)]
        if comm.rank == 0:
            entering.set()
        else:
            entering.wait()
        return seqpar.attention(*shards, comm=comm, strategy="ring")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        out = part.unshard(seqpar.ThreadWorld(2, threads=1, timeout=30).run(rank))
    finally:
        sys.setswitchinterval(interval)
    want, _ = reference(q, k, v)
    assert (out.double() - want).abs().max().item() < TOL_F32


def _mesh_label(m):
    """A planner mesh's name as seqpar's choice labels spell it (plan/selection.h)."""
    label = m["strategy"]
    if m["schedule"] != "default":
        label += "_" + m["schedule"]
    if m["strategy"] == "usp":
        label += f"_u{m['ulysses_degree']}_r{m['ring_degree']}"
    return label


# "auto" is one selection: seqpar.attention(strategy="auto") and decode_attention run what
# `seqpar run --strategy auto` chooses and what `seqpar plan` (the same request, the group's
# settings pinned) ranks first, on a grid of requests over a sequence and over a cache, and the
# result is PyTorch's.
@pytest.mark.parametrize("hardware", ["cpu-ethernet", "h100"])
@pytest.mark.parametrize("ranks,seq,heads,kv_heads,causal,cache", [
    (2, 96, 4, 4, True, 0), (3, 100, 6, 2, False, 0), (4, 128, 8, 8, True, 0),
    (4, 120, 4, 1, False, 0), (2, 48, 4, 2, True, 5), (4, 64, 8, 8, True, 60)])
def test_auto_is_one_choice(hardware, ranks, seq, heads, kv_heads, causal, cache):
    D = 16
    q, k, v = qkv(1, seq, heads, kv_heads, D, seed=ranks + seq)
    if cache:  # the last `cache` tokens are new, their queries split over the ranks
        P, T = seq, cache
        kv_counts = [len(x) for x in np.array_split(np.arange(P), ranks)]
        q_counts = [len(x) for x in np.array_split(np.arange(T), ranks)]

        def rank(comm):
            lo, qlo = sum(kv_counts[:comm.rank]), sum(q_counts[:comm.rank])
            out = seqpar.decode_attention(
                q[:, P - T + qlo:P - T + qlo + q_counts[comm.rank]],
                k[:, lo:lo + kv_counts[comm.rank]], v[:, lo:lo + kv_counts[comm.rank]],
                comm=comm, strategy="auto", hardware=hardware)
            return out, comm.last_strategy

        results = seqpar.ThreadWorld(ranks).run(rank)
        got = torch.cat([r[0] for r in results], dim=1)
        want, _ = reference(q[:, P - T:], k, v, causal=True, q_pos=range(P - T, P))
        cli = ["--cached", str(P - T), "--new", str(T), "--causal"]
        plan = seqpar.plan(ranks=ranks, heads=heads, kv_heads=kv_heads, head_dim=D, causal=True,
                           cached=P - T, new=T, hardware=hardware, tp=1, cfg=1,
                           layout="contiguous", dtype="fp32", memory_limit_gb=1e9)
    else:
        part = seqpar.Partition(seq, ranks)

        def rank(comm):
            x = [part.shard(t, comm.rank) for t in (q, k, v)]
            out = seqpar.attention(*x, comm=comm, strategy="auto", causal=causal,
                                   hardware=hardware)
            return out, comm.last_strategy

        results = seqpar.ThreadWorld(ranks).run(rank)
        got = part.unshard([r[0] for r in results])
        want, _ = reference(q, k, v, causal=causal)
        cli = ["--seq", str(seq)] + (["--causal"] if causal else [])
        plan = seqpar.plan(ranks=ranks, seq=seq, heads=heads, kv_heads=kv_heads, head_dim=D,
                           causal=causal, hardware=hardware, tp=1, cfg=1, layout="contiguous",
                           ulysses_mode="uaa", pad=False, dtype="fp32", memory_limit_gb=1e9)
    assert (got.double() - want).abs().max().item() < TOL_F32
    ran = {r[1] for r in results}
    assert len(ran) == 1, ran
    run = json.loads(subprocess.run(
        [os.environ["SEQPAR_BIN"], "run", "--strategy", "auto", "--ranks", str(ranks), "--heads",
         str(heads), "--kv-heads", str(kv_heads), "--head-dim", str(D), "--hardware", hardware,
         "--repeat", "1", "--warmup", "0", "--json"] + cli,
        check=True, capture_output=True, text=True).stdout)
    assert ran == {run["choice_label"]} == {_mesh_label(plan["meshes"][0])}, (
        ran, run["choice_reason"], plan["meshes"][0])


def test_names_users_reach_for():
    """A comm that is not one is refused in one line; plan takes the flag's name memory_limit
    beside memory_limit_gb, and the two give the same plan."""
    q = np.zeros((1, 4, 2, 8), np.float32)
    with pytest.raises(ValueError, match=r"^comm None is not a communicator; pass the comm"):
        seqpar.attention(q, q, q, comm=None)
    ask = dict(ranks=4, seq=4096, heads=8, causal=True, hardware="h100")
    a = seqpar.plan(memory_limit=0.05, **ask)
    b = seqpar.plan(memory_limit_gb=0.05, **ask)
    assert a == b and a != seqpar.plan(**ask)
    with pytest.raises(ValueError, match="give one"):
        seqpar.plan(memory_limit=1, memory_limit_gb=2, **ask)


def test_plan_simulates_as_the_command_line(tmp_path):
    """seqpar.plan(simulate=True, sim_ranks=, svg=) gives seqpar plan --simulate --json's
    simulation and writes the same SVG chart; a bad sim_ranks is one line naming it."""
    ask = ["--seq", "8192", "--heads", "8", "--causal", "--ranks", "8", "--hardware", "h100"]
    svg_cli = tmp_path / "cli.svg"
    cli = json.loads(subprocess.run(
        [os.environ["SEQPAR_BIN"], "plan", *ask, "--simulate", "--sim-ranks", "2:16", "--svg",
         str(svg_cli), "--json"], capture_output=True, text=True, check=True).stdout)
    svg_py = tmp_path / "py.svg"
    got = seqpar.plan(seq=8192, heads=8, causal=True, ranks=8, hardware="h100", simulate=True,
                      sim_ranks="2:16", svg=svg_py)
    assert got["simulation"] == cli["simulation"] and got["simulation"]["sizes"] == [2, 4, 8, 16]
    assert svg_py.read_text() == svg_cli.read_text() and "<svg" in svg_py.read_text()
    assert "simulation" not in seqpar.plan(seq=8192, heads=8, causal=True, ranks=8)
    with pytest.raises(ValueError, match=r"^sim_ranks '0:4' is invalid; give FIRST:LAST"):
        seqpar.plan(seq=8192, heads=8, ranks=8, simulate=True, sim_ranks="0:4")
