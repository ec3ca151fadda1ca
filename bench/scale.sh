#!/usr/bin/env bash
# Scale on one machine: long sequences through seqpar run, with time and memory per rank.
#
#   prefill: causal ring attention over 131072 tokens (H = 8, D = 128, fp32, zigzag layout so
#            both ranks do the same work) on 2 ranks; about 35 TFLOP, minutes on a small CPU.
#   decode:  pass-Q decode of 4 new tokens over a 1,048,576-token K/V cache (H = 32 query heads,
#            Hkv = 8, D = 128, bf16) on 8 ranks: each rank keeps its 131072-token cache shard;
#            only the queries and the partial states travel.
#
#   bench/scale.sh [--build DIR] [--only prefill|decode] [--backend threads|mpi|both]
#                  [--prefill-seq 131072] [--decode-cached 1048576] [--verify] [--out FILE]
#
# Prints a markdown table per benchmark: time, GFLOP/s, bytes sent per rank, K/V held per rank
# (own shard vs peak, the ring's promise: own shard plus at most two blocks in flight), the bytes
# of each rank's tensors, and the peak resident memory: under mpi per rank (each rank is a
# process, VmHWM), under threads the one process's (shared by the ranks). The prefill is one
# timed run with no warm-up (--repeat 1 --warmup 0), the decode the median of 3 after one
# warm-up. --verify checks both against the reference (a sample of the prefill's query rows;
# every new token of the decode): rank 0 then regenerates the whole sequence's K/V (4 GiB in
# bf16 for the 1M-token cache) and the reference takes minutes, so the communication deadline
# is raised to 900 s.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="$root/build"
only=""
backend="mpi"
prefill_seq=131072
decode_cached=1048576
verify=()
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --backend) backend="$2"; shift 2 ;;
    --prefill-seq) prefill_seq="$2"; shift 2 ;;
    --decode-cached) decode_cached="$2"; shift 2 ;;
    --verify) verify=(--verify --timeout 900); shift ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "scale.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
seqpar="$build/seqpar"
[[ -x "$seqpar" ]] || { echo "scale.sh: $seqpar not built" >&2; exit 2; }
py=/usr/bin/python3
backends=("$backend")
[[ "$backend" == both ]] && backends=(threads mpi)

run() {  # backend ranks args... -> JSON line
  local be=$1 ranks=$2
  shift 2
  if [[ "$be" == mpi ]]; then
    local m=(mpirun -np "$ranks" --oversubscribe)
    [[ $(id -u) -eq 0 ]] && m+=(--allow-run-as-root)
    "${m[@]}" "$seqpar" run --backend mpi "$@" --json
  else
    "$seqpar" run --ranks "$ranks" "$@" --json
  fi
}

read -r -d '' table_py <<'PY' || true
import json, sys
title = sys.argv[1]
rows = [json.loads(l) for l in sys.stdin if l.strip().startswith("{")]
print(f"\n### {title}\n")
if not rows:
    print("(no result: the run failed, see stderr)")
for j in rows:
    n = j["ranks"]
    mb = lambda x: f"{x / 2**20:.0f}"
    err = j["max_abs_err"]
    e = 4 if j["dtype"] == "fp32" else 2
    kv_own = [2 * t * j["batch"] * j["kv_heads"] * j["head_dim"] * e for t in j["tokens_per_rank"]]
    if "cached" in j:  # decode: a rank's cache shard plus its new tokens
        kv_own = [None] * n
    err_text = "not verified" if err is None else f"{err:.2e}"
    shared = " (peak RSS: the one process of all ranks)" if j["rss_shared_by_ranks"] else ""
    print(f"- backend {j['backend']}, {n} ranks x {j['threads']} threads, {j['strategy']}, "
          f"layout {j['layout']}, {j['dtype']}: **{j['seconds']:.3f} s**, {j['gflops']:.1f} GFLOP/s, "
          f"work imbalance {j['work_imbalance']:.3f}, exposed comm {j['exposed_comm_fraction']:.3f}, "
          f"max abs err {err_text}{shared}")
    print()
    print("| rank | queries | bytes sent | peak K/V MB | tensors MB | peak RSS MB |")
    print("|---|---|---|---|---|---|")
    for r in range(n):
        print(f"| {r} | {j['tokens_per_rank'][r]} | {j['bytes_sent_per_rank'][r]} | "
              f"{mb(j['peak_kv_bytes_per_rank'][r])} | {mb(j['tensor_bytes_per_rank'][r])} | "
              f"{mb(j['peak_rss_bytes_per_rank'][r])} |")
    if kv_own[0] is not None:
        print(f"\nown K/V shard per rank: {mb(kv_own[0])} MB; ring peak = own shard + blocks in flight")
PY
table() { "$py" -c "$table_py" "$1"; }  # title; JSON lines on stdin

{
  echo "# seqpar at scale ($(date -u '+%Y-%m-%d %H:%M UTC'))"
  echo
  echo "machine: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee ${out:+"$out"}

for be in "${backends[@]}"; do
  if [[ -z "$only" || "$only" == prefill ]]; then
    run "$be" 2 --strategy ring --layout zigzag --seq "$prefill_seq" --heads 8 --head-dim 128 \
      --causal --repeat 1 --warmup 0 ${verify[@]+"${verify[@]}"} |
      table "prefill: causal ring, $prefill_seq tokens, H 8, D 128, fp32, 2 ranks ($be)" |
      tee ${out:+-a "$out"}
  fi
  if [[ -z "$only" || "$only" == decode ]]; then
    run "$be" 8 --strategy passq --cached "$decode_cached" --new 4 --heads 32 --kv-heads 8 \
      --head-dim 128 --dtype bf16 --causal --repeat 3 --warmup 1 ${verify[@]+"${verify[@]}"} |
      table "decode: pass-Q, 4 new tokens over $decode_cached cached, H 32, Hkv 8, D 128, bf16, 8 ranks ($be)" |
      tee ${out:+-a "$out"}
  fi
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee ${out:+-a "$out"}
