#!/usr/bin/env bash
# Causal ring attention on contiguous shards with and without work stealing, beside zigzag:
# step time (the median of --repeat timed runs of the slowest rank), GFLOP/s, work imbalance
# and bytes sent per rank, and the ratios steal/contiguous and steal/zigzag, per rank count.
#
#   bench/steal.sh [--build DIR] [--ranks "2 4"] [--seq 16384] [--heads 8] [--head-dim 64]
#                  [--repeat 3] [--rounds 1] [--threads 1] [--verify] [--out FILE]
#
# The three layouts run one after another in each round (so they share the machine's state);
# with --rounds R > 1 each figure is the median over the rounds. --threads 1: one kernel thread
# per rank, so that the ranks compete for cores as little as a small machine allows.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="$root/build"
ranks_list="2 4"
seq=16384
heads=8
head_dim=64
repeat=3
rounds=1
threads=1
verify=()
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --ranks) ranks_list="$2"; shift 2 ;;
    --seq) seq="$2"; shift 2 ;;
    --heads) heads="$2"; shift 2 ;;
    --head-dim) head_dim="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --verify) verify=(--verify); shift ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "steal.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
seqpar="$build/seqpar"
[[ -x "$seqpar" ]] || { echo "steal.sh: $seqpar not built" >&2; exit 2; }
py=/usr/bin/python3

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for ranks in $ranks_list; do
  for ((round = 0; round < rounds; ++round)); do
    for variant in contiguous zigzag steal; do
      case $variant in
        contiguous) args=(--layout contiguous) ;;
        zigzag) args=(--layout zigzag) ;;
        steal) args=(--layout contiguous --schedule steal) ;;
      esac
      json=$("$seqpar" run --strategy ring "${args[@]}" --ranks "$ranks" --seq "$seq" \
        --heads "$heads" --head-dim "$head_dim" --causal --threads "$threads" \
        --repeat "$repeat" "${verify[@]}" --json)
      echo "$ranks $variant $json" >> "$results"
    done
  done
done

table=$("$py" - "$results" "$seq" "$heads" "$head_dim" "$repeat" "$rounds" "$threads" <<'EOF'
import json, statistics, sys
path, seq, heads, head_dim, repeat, rounds, threads = sys.argv[1:]
runs = {}
for line in open(path):
    ranks, variant, js = line.split(" ", 2)
    runs.setdefault((int(ranks), variant), []).append(json.loads(js))
print(f"causal ring, S = {seq}, H = {heads}, D = {head_dim}, fp32, threads backend, "
      f"--threads {threads}; seconds: median of {repeat} timed runs (x {rounds} rounds)")
print()
print("| ranks | layout | seconds | GFLOP/s | work imbalance | max bytes sent/rank | steal/this |")
print("|---|---|---|---|---|---|---|")
for ranks in sorted({k[0] for k in runs}):
    sec = {v: statistics.median(r["seconds"] for r in runs[(ranks, v)])
           for v in ("contiguous", "zigzag", "steal")}
    for v in ("contiguous", "zigzag", "steal"):
        r = runs[(ranks, v)][-1]
        name = "contiguous + steal" if v == "steal" else v
        gf = statistics.median(x["gflops"] for x in runs[(ranks, v)])
        ok = "" if r.get("ok", True) else " (verify FAILED)"
        ratio = "" if v == "steal" else f"{sec['steal'] / sec[v]:.3f}"
        print(f"| {ranks} | {name}{ok} | {sec[v]:.3f} | {gf:.1f} | {r['work_imbalance']:.4f} | "
              f"{max(r['bytes_sent_per_rank'])} | {ratio} |")
EOF
)
echo "$table"
[[ -n "$out" ]] && echo "$table" > "$out"
exit 0
