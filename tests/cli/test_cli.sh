#!/usr/bin/env bash
# The command line: `seqpar run` verifies against the reference on both backends, prints the
# JSON keys of the contract, and rejects bad input with exit 2 and one line.
# usage: test_cli.sh path/to/seqpar [path/to/mpiexec]
set -u
bin=${1:?usage: test_cli.sh path/to/seqpar [mpiexec]}
mpiexec=${2:-}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# 1. threads backend: every strategy x layout x causal, uneven S, GQA.
for strategy in ring allgather; do
  for layout in contiguous striped zigzag; do
    for causal in "" "--causal"; do
      expect_ok "threads $strategy $layout $causal" "$bin" run --strategy $strategy --layout $layout \
        --ranks 3 --seq 301 --heads 4 --kv-heads 2 --head-dim 32 $causal --verify --json
    done
  done
done
expect_ok "threads bf16" "$bin" run --ranks 4 --seq 256 --heads 2 --head-dim 64 --dtype bf16 --causal --verify --json
expect_ok "threads batch 2" "$bin" run --ranks 2 --seq 100 --heads 2 --head-dim 16 --batch 2 --verify --json
expect_ok "threads one rank" "$bin" run --ranks 1 --seq 64 --heads 2 --head-dim 16 --verify --json
expect_ok "threads 8 ranks" "$bin" run --ranks 8 --seq 1000 --heads 2 --head-dim 16 --causal --verify --json

# 2. JSON keys of the contract and exact byte counts for an even ring.
out=$("$bin" run --strategy ring --ranks 2 --seq 256 --heads 2 --head-dim 32 --causal --verify --json)
for key in strategy layout backend ranks seq heads kv_heads head_dim dtype causal seconds gflops \
    max_abs_err ok bytes_sent_per_rank bytes_recv_per_rank peak_kv_bytes_per_rank work_imbalance; do
  python3 -c 'import json,sys; sys.exit(0 if sys.argv[2] in json.loads(sys.argv[1]) else 1)' "$out" "$key" \
    && ok || bad "run --json lacks $key"
done
# 2·S·Hkv·D·e·(N-1)/N = 2·256·2·32·4·1/2 = 65536 bytes per rank
[ "$(json_get "$out" bytes_sent_per_rank)" = "[65536, 65536]" ] && ok || bad "ring bytes: $(json_get "$out" bytes_sent_per_rank)"
# contiguous causal on 2 ranks: rank 1 does 3x the work of rank 0 -> max/mean = 1.5
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if abs(d["work_imbalance"]-1.5)<0.01 else 1)' "$out" \
  && ok || bad "work_imbalance $(json_get "$out" work_imbalance)"
out=$("$bin" run --strategy ring --layout zigzag --ranks 4 --seq 4096 --heads 1 --head-dim 16 --causal --json --repeat 1)
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if d["work_imbalance"]<=1.05 else 1)' "$out" \
  && ok || bad "zigzag work_imbalance $(json_get "$out" work_imbalance)"

# 3. Table output names the verification.
"$bin" run --ranks 2 --seq 128 --heads 2 --head-dim 16 --verify | grep -q "verify.*ok" && ok || bad "table lacks verify ok"
"$bin" info | grep -q "kernel" && ok || bad "info lacks kernel line"
"$bin" info --json | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if "threads" in d["backends"] else 1)' \
  && ok || bad "info --json"
# The model's elementwise and normalisation ops name their path, capped by SEQPAR_KERNEL_ISA.
SEQPAR_KERNEL_ISA=scalar "$bin" info | grep -q "ops .*rms_norm scalar.*rope scalar" && ok || bad "info lacks the ops line"
SEQPAR_KERNEL_ISA=scalar "$bin" info --json | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if d["model_ops"]["swiglu"] == "scalar" else 1)' \
  && ok || bad "info --json lacks model_ops"
# Large tensor storage kept for reuse (core/block_cache.h): its limit, set by SEQPAR_TENSOR_CACHE_MB;
# a value that is not whole MiB is refused (exit 2, one line), also by a run.
SEQPAR_TENSOR_CACHE_MB=256 "$bin" info | grep -q "memory .*reuse up to 256 MiB" && ok || bad "info lacks the memory line"
"$bin" info --json | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["tensor_cache_bytes"] == 1 << 30 else 1)' \
  && ok || bad "info --json: tensor_cache_bytes is not the default 1 GiB"
for v in abc -1 12x 1.5 99999999999999999999; do
  SEQPAR_TENSOR_CACHE_MB=$v expect_exit2 "SEQPAR_TENSOR_CACHE_MB='$v' is not valid: expected whole MiB from 0" info
done
SEQPAR_TENSOR_CACHE_MB=x expect_exit2 "SEQPAR_TENSOR_CACHE_MB='x' is not valid" run --ranks 2 --seq 4096 --heads 2 --head-dim 64
# From 2 MiB on huge pages where the kernel grants them (SEQPAR_HUGE_PAGES: auto, the default: while
# their first touch is fast; 1: always; 0: never).
SEQPAR_HUGE_PAGES=0 "$bin" info | grep -q "memory .*small pages only (SEQPAR_HUGE_PAGES=0)" && ok || bad "info: SEQPAR_HUGE_PAGES=0 not said"
SEQPAR_HUGE_PAGES=0 "$bin" info --json | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["huge_pages"] is False else 1)' \
  && ok || bad "info --json: huge_pages is not false with SEQPAR_HUGE_PAGES=0"
if grep -qE '\[(always|madvise)\]' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null; then
  "$bin" info | grep -q "memory .*from 2 MiB on transparent huge pages while their first touch is fast (SEQPAR_HUGE_PAGES=auto)" \
    && ok || bad "info: huge pages (auto) not said"
  SEQPAR_HUGE_PAGES=1 "$bin" info | grep -q "memory .*from 2 MiB on transparent huge pages (SEQPAR_HUGE_PAGES=1)" \
    && ok || bad "info: SEQPAR_HUGE_PAGES=1 not said"
fi
for v in auto 1 0; do
  SEQPAR_HUGE_PAGES=$v "$bin" info --json | python3 -c 'import json,sys; m={"auto":"auto","1":"on","0":"off"}; sys.exit(0 if json.load(sys.stdin)["huge_pages_mode"] == m[sys.argv[1]] else 1)' "$v" \
    && ok || bad "info --json: huge_pages_mode is not that of SEQPAR_HUGE_PAGES=$v"
done
for v in 2 yes -1 " 1" Auto; do
  SEQPAR_HUGE_PAGES=$v expect_exit2 "SEQPAR_HUGE_PAGES='$v' is not valid: expected auto" info
done

# 4. Bad input: exit 2, one line naming the parameter.
check_bad() { local word=$1; shift; expect_exit2 "$word" run "$@"; }  # <word> <run args...>
base="--ranks 2 --seq 128 --heads 2 --head-dim 32"
check_bad "--ranks" $base --ranks 0
check_bad "--ranks" --ranks 200 --seq 100
check_bad "--kv-heads" $base --heads 6 --kv-heads 4
check_bad "--strategy" $base --strategy spiral
check_bad "--layout" $base --layout spiral
check_bad "--seq" $base --seq -5
check_bad "--seq" $base --seq 0
# Integers in decimal only: CLI11 alone would read 0x10, +5 and '' (as 0), and -1 into a seed.
check_bad "--seq: '0x10' is not a decimal integer" $base --seq 0x10
check_bad "--seq: '+5' is not a decimal integer" $base --seq +5
check_bad "--seq: '' is not a decimal integer" $base --seq ''
check_bad "--seed: '-1' is not a non-negative decimal integer" $base --seed -1
check_bad "--heads: '2.5' is not a decimal integer" $base --heads 2.5
# Reals in decimal only, on every real flag: CLI11 alone would read '' as 0 and hex floats (0x10,
# 0x1p3); inf and nan reach the range check, which names them.
for flag in "run $base --timeout" "model --preset tiny-dit --guidance" \
    "plan --seq 1024 --heads 8 --memory-limit" "denoise --guidance" "denoise --guidance-2" \
    "denoise --shift" "denoise --boundary-ratio"; do
  for v in '' 0x10 0x1p3 +5 1e 1.5x; do
    # shellcheck disable=SC2086
    expect_exit2 "${flag##* }: '$v' is not a decimal number" $flag "$v"
  done
done
expect_exit2 "--timeout inf is out of range" run $base --timeout inf
expect_exit2 "--guidance nan is out of range" model --preset tiny-dit --guidance nan
out=$("$bin" run $base --repeat 1 --timeout 2.5e1 --json 2>&1)
[ "$(json_get "$out" timeout_s 2>/dev/null)" = 25.0 ] && ok || bad "--timeout 2.5e1: $out"
# A flag another subcommand takes is named as theirs, never suggested as itself.
expect_exit2 "not expected: x --output (--output is a flag of denoise and generate, not of run)" \
  run $base --output x
expect_exit2 "(--prompt-ids is a flag of generate, not of model)" model --prompt-ids 1
# An empty text is no value (it used to read as the flag left out).
check_bad "--trace: '' is empty; give a value or leave the flag out" $base --trace ''
check_bad "--strategy: '' is empty" $base --strategy ''
# Request lengths past the limit are named as given, before their sum.
check_bad "--cached-lens sums past 4294967296 tokens" --strategy passq --ranks 2 --heads 2 \
  --head-dim 8 --cached-lens 4294967296,4294967296 --new-lens 1,1
check_bad "--heads" $base --heads 0
check_bad "--head-dim" $base --head-dim 0
check_bad "--dtype" $base --dtype int8
check_bad "--backend" $base --backend nccl
check_bad "--batch" $base --batch -1

# 5. mpi backend under mpiexec.
if [ -n "$mpiexec" ]; then
  mpi=("$mpiexec" --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none)
  for np in 2 4; do
    for strategy in ring allgather; do
      expect_ok "mpi np$np $strategy" "${mpi[@]}" -n $np "$bin" run --backend mpi --strategy $strategy \
        --layout zigzag --seq 517 --heads 4 --kv-heads 2 --head-dim 32 --causal --verify --json
    done
  done
  out=$("${mpi[@]}" -n 2 "$bin" run --backend mpi --seq 256 --heads 2 --head-dim 32 --json 2>&1)
  [ "$(json_get "$out" backend)" = "mpi" ] && ok || bad "mpi backend not reported: $out"
  [ "$(echo "$out" | grep -c '^{')" -eq 1 ] && ok || bad "mpi run printed more than one JSON object"
  err=$("${mpi[@]}" -n 2 "$bin" run --backend mpi --ranks 3 --seq 64 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] && ok || bad "mpi --ranks mismatch exited $rc, want 2"
  echo "$err" | grep -q "world size" && ok || bad "mpi --ranks mismatch message: $err"
else
  echo "skip: no mpiexec given"
fi

# seqpar mesh: the design's example, JSON keys and half-open ranges, exit 2 with valid choices.
mesh_json=$("$bin" mesh --tp 4 --ring-degree 8 --heads 40 --seq 1024 --json 2>&1); rc=$?
[ $rc -eq 0 ] && ok || bad "mesh --json exited $rc: $mesh_json"
python3 -c '
import json, sys
rows = json.loads(sys.argv[1])
keys = {"rank", "cfg_rank", "tp_rank", "ulysses_rank", "ring_rank", "cp_rank", "heads", "tokens"}
assert len(rows) == 32 and all(set(r) == keys for r in rows), "rows or keys"
r8 = rows[8]
assert (r8["tp_rank"], r8["cp_rank"], r8["heads"], r8["tokens"]) == (1, 0, [10, 20], [0, 128]), r8
assert sorted(tuple(r["tokens"]) for r in rows if r["tp_rank"] == 0)[-1] == (896, 1024)
' "$mesh_json" && ok || bad "mesh --json rows: $mesh_json"
out=$("$bin" mesh --tp 4 --ring-degree 8 --heads 40 --seq 1024 2>&1); rc=$?
[ $rc -eq 0 ] && ok || bad "mesh table exited $rc"
echo "$out" | grep -Eq '^ +8 +0 +1 +0 +0 +0 +10-19 +0-127$' && ok || bad "mesh table row 8: $out"
# uneven tokens, every axis, '_' spellings
out=$("$bin" mesh --cfg 2 --tp 2 --ulysses_degree 2 --ring_degree 2 --heads 4 --seq 1001 --json); rc=$?
[ $rc -eq 0 ] && ok || bad "mesh 4 axes exited $rc"
python3 -c '
import json, sys
rows = json.loads(sys.argv[1])
assert len(rows) == 16
assert [r["tokens"] for r in rows[:4]] == [[0, 251], [251, 501], [501, 751], [751, 1001]], rows[:4]
assert [(r["ring_rank"], r["ulysses_rank"], r["cp_rank"]) for r in rows[:4]] == [(0,0,0),(0,1,1),(1,0,2),(1,1,3)]
assert rows[12]["cfg_rank"] == 1 and rows[12]["tp_rank"] == 1 and rows[12]["heads"] == [2, 4]
' "$out" && ok || bad "mesh 4 axes rows: $out"
out=$("$bin" mesh --tp 2 --ring-degree 2 --heads 4 --seq 64 --ranks 4 --json); rc=$?
[ $rc -eq 0 ] && ok || bad "mesh --ranks equal to the product exited $rc"
check_mesh_bad() { local word=$1; shift; expect_exit2 "$word" mesh "$@"; }  # <word> <args...>
check_mesh_bad "2 x 2" --tp 4 --ring-degree 8 --heads 40 --seq 1024 --ranks 16
check_mesh_bad "1, 2, 4, 5, 8, 10, 20, 40" --tp 3 --heads 40 --seq 1024
check_mesh_bad "--seq" --ring-degree 8 --heads 4 --seq 5
check_mesh_bad "--tp" --tp 0 --heads 4 --seq 8
check_mesh_bad "--ranks" --heads 4 --seq 8 --ranks 0
check_mesh_bad "--heads" --seq 8

# 6. const-max softmax (ring, usp): verified, reported; bytes = the ring's + the key-norm all-reduce.
expect_ok "const-max ring" "$bin" run --softmax const-max --strategy ring --layout zigzag --ranks 3 \
  --seq 301 --heads 4 --kv-heads 2 --head-dim 32 --causal --verify --json
expect_ok "const-max usp" "$bin" run --softmax const-max --strategy usp --ulysses-degree 2 --ranks 4 \
  --seq 301 --heads 4 --kv-heads 2 --head-dim 32 --causal --verify --json
out=$("$bin" run --softmax const-max --ranks 2 --seq 256 --heads 2 --head-dim 32 --causal --json --repeat 1)
[ "$(json_get "$out" softmax)" = "const-max" ] && ok || bad "softmax key: $out"
[ "$(json_get "$out" fallback_rows)" = "0" ] && ok || bad "fallback_rows $(json_get "$out" fallback_rows)"
# 65536 bytes of K/V (as the online ring above) + B·Hkv = 2 fp32 key norms to the 1 other rank
[ "$(json_get "$out" bytes_sent_per_rank)" = "[65544, 65544]" ] && ok || bad "const-max bytes: $(json_get "$out" bytes_sent_per_rank)"
check_bad "--softmax" $base --softmax const-max --strategy allgather
check_bad "--softmax" $base --softmax const-max --strategy ulysses
check_bad "--softmax" $base --softmax fixed
check_bad "--softmax" --softmax const-max --strategy passq --cached 64 --new 4 --heads 2 --head-dim 16
if [ -n "$mpiexec" ]; then
  expect_ok "mpi const-max" "${mpi[@]}" -n 2 "$bin" run --backend mpi --softmax const-max \
    --layout zigzag --seq 301 --heads 4 --kv-heads 2 --head-dim 32 --causal --verify --json
fi

# 7. Performance reporting: --trace writes a Chrome/Perfetto trace (pid = rank, lanes 0 compute
#    and 1 comm, one slice per ring step with its bytes), exposed_comm_fraction and memory keys,
#    --warmup; on both backends.
check_trace() {  # check_trace <description> <file> <ranks> <zero_copy 0|1>
  python3 -c '
import json, sys
path, ranks, zero_copy = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ev = json.load(open(path))["traceEvents"]
x = [e for e in ev if e["ph"] == "X"]
assert {e["pid"] for e in x} == set(range(ranks)), {e["pid"] for e in x}
assert {e["tid"] for e in x} == {0, 1}
for r in range(ranks):
    steps = [e for e in x if e["pid"] == r and e["name"].startswith("ring step") and e["tid"] == 0]
    assert len(steps) == 2 * ranks, (r, len(steps))  # warm-up + 1 run, N steps each
    transfers = [e for e in x if e["pid"] == r and e["name"].endswith("transfer")]
    # N-1 transfers a run; N where blocks are copied (mpi: the runner lends its K/V to the ring,
    # the last transfer bringing the own block home)
    assert len(transfers) == 2 * (ranks - 1 if zero_copy else ranks), (r, len(transfers))
    assert all(t["args"]["bytes_recv"] > 0 and t["args"]["zero_copy"] == zero_copy for t in transfers)
    assert any(e["pid"] == r and e["name"] == "attention" and e["cat"] == "kernel" for e in x)
    assert any(e["pid"] == r and e["name"] == "barrier" and e["tid"] == 1 for e in x)
assert all(e.keys() >= {"ts", "dur"} for e in x)  # fields of the format (clock readings: not judged)
' "$2" "$3" "$4" && ok || bad "$1: trace $2"
}
tmp_trace=$(mktemp -d)
out=$("$bin" run --ranks 3 --seq 300 --heads 2 --head-dim 16 --repeat 1 --trace "$tmp_trace/t.json" --json); rc=$?
[ $rc -eq 0 ] && ok || bad "run --trace exited $rc"
check_trace "threads" "$tmp_trace/t.json" 3 1
for key in exposed_comm_fraction exposed_comm_fraction_per_rank end_sync_fraction end_sync_fraction_per_rank \
    peak_rss_bytes_per_rank tensor_bytes_per_rank; do
  python3 -c 'import json,sys; sys.exit(0 if sys.argv[2] in json.loads(sys.argv[1]) else 1)' "$out" "$key" \
    && ok || bad "run --json lacks $key"
done
python3 -c '
import json, sys
d = json.loads(sys.argv[1])
# (the fractions are clock readings: their values are for the benchmarks, not judged here)
assert len(d["exposed_comm_fraction_per_rank"]) == 3
assert d["exposed_comm_fraction"] == max(d["exposed_comm_fraction_per_rank"])
assert all(x > 0 for x in d["peak_rss_bytes_per_rank"] + d["tensor_bytes_per_rank"])
# the ring reads its own shard plus two blocks in flight (borrowed, not copied, on threads):
# 3 x K and V of 100 tokens, 2 heads, 16 dims, fp32
assert d["peak_kv_bytes_per_rank"] == [3 * 2 * 100 * 2 * 16 * 4] * 3, d["peak_kv_bytes_per_rank"]
' "$out" && ok || bad "exposed/memory keys: $out"
out=$("$bin" run --ranks 2 --seq 64 --heads 2 --head-dim 16 --repeat 2 --warmup 0 --json); rc=$?
[ $rc -eq 0 ] && [ "$(json_get "$out" warmup)" = "0" ] && ok || bad "--warmup 0: $out"
check_bad "--warmup" $base --warmup -1
"$bin" run --ranks 2 --seq 64 --heads 2 --head-dim 16 --repeat 1 --trace /nonexistent-dir/t.json \
  >/dev/null 2>&1; rc=$?
[ $rc -eq 1 ] && ok || bad "unwritable --trace exited $rc, want 1"
if [ -n "$mpiexec" ]; then
  out=$("${mpi[@]}" -n 2 "$bin" run --backend mpi --seq 300 --heads 2 --head-dim 16 --repeat 1 \
    --trace "$tmp_trace/m.json" --json); rc=$?
  [ $rc -eq 0 ] && ok || bad "mpi run --trace exited $rc"
  check_trace "mpi" "$tmp_trace/m.json" 2 0
  python3 -c '
import json, sys
d = json.loads(sys.argv[1])
assert d["rss_shared_by_ranks"] is False and len(d["peak_rss_bytes_per_rank"]) == 2
# the ring lends its own shard as a receive buffer: 2 x K and V of 150 tokens, 2 heads, 16 dims
assert d["peak_kv_bytes_per_rank"] == [2 * 2 * 150 * 2 * 16 * 4] * 2, d["peak_kv_bytes_per_rank"]
assert d["measured_kv_bytes_per_rank"] == d["peak_kv_bytes_per_rank"], d
' "$out" && ok || bad "mpi memory keys: $out"
fi
rm -rf "$tmp_trace"

echo "cli: $pass passed, $fail failed"
[ $fail -eq 0 ]
