#!/usr/bin/env bash
# Threads inside one rank: seqpar run on 1 rank with --threads 1 and --threads T, interleaved
# rounds (this machine's speed drifts), best of the rounds for each; prints a markdown table with
# the speedup.
#
#   bench/threads_per_rank.sh [--build DIR] [--threads 2] [--rounds 3] [--seq 8192]
#                             [--heads 8] [--head-dim 128] [--causal] [--dtype fp32]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/../build"
threads=2
rounds=3
seq=8192
heads=8
head_dim=128
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --seq) seq="$2"; shift 2 ;;
    --heads) heads="$2"; shift 2 ;;
    --head-dim) head_dim="$2"; shift 2 ;;
    --causal) extra+=(--causal); shift ;;
    --dtype) extra+=(--dtype "$2"); shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "threads_per_rank.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
seqpar="$build/seqpar"
[[ -x "$seqpar" ]] || { echo "threads_per_rank.sh: $seqpar not built" >&2; exit 2; }
py=/usr/bin/python3
rate() {
  "$seqpar" run --ranks 1 --threads "$1" --seq "$seq" --heads "$heads" --head-dim "$head_dim" \
    ${extra[@]+"${extra[@]}"} --repeat 3 --json |
    "$py" -c "import json,sys; print(json.load(sys.stdin)['gflops'])"
}
best1=0 bestT=0
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 1; r <= rounds; ++r)); do
  a="$(rate 1)"
  b="$(rate "$threads")"
  echo "round $r: 1 thread $a GFLOP/s, $threads threads $b GFLOP/s"
  best1="$("$py" -c "print(max($best1, $a))")"
  bestT="$("$py" -c "print(max($bestT, $b))")"
done
echo
echo "| S | H | D | options | 1 thread GFLOP/s | $threads threads GFLOP/s | speedup |"
echo "|---|---|---|---|---|---|---|"
printf '| %s | %s | %s | %s | %.1f | %.1f | %.2fx |\n' "$seq" "$heads" "$head_dim" \
  "${extra[*]:-}" "$best1" "$bestT" "$("$py" -c "print($bestT / $best1)")"
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
