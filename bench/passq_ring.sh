#!/usr/bin/env bash
# Ring pass-Q against all-gather pass-Q over a distributed K/V cache: bytes per rank (CommStats,
# from --json), time, and exposed communication (exposed_comm_fraction: per rank, the median over
# the timed runs of time blocked in communication / call time; the table shows the worst rank)
# at T = 1, 64, 4096 new tokens over P cached tokens on N ranks, threads backend.
#
#   bench/passq_ring.sh [--build DIR] [--cached P] [--ranks N] [--repeat R] [--trace-dir DIR]
#
# With --trace-dir, each run also writes a Chrome/Perfetto trace there (ui.perfetto.dev): lane
# `compute` holds the ring's steps, lane `comm` each step's Q transfer and the all-to-all.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/../build"
cached=16384
ranks=4
repeat=3
trace_dir=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --cached) cached="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    --trace-dir) trace_dir="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "passq_ring.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
seqpar="$build/seqpar"
[[ -x "$seqpar" ]] || { echo "passq_ring.sh: $seqpar not built" >&2; exit 2; }
[[ -n "$trace_dir" ]] && mkdir -p "$trace_dir"
shape=(--heads 8 --kv-heads 2 --head-dim 64 --causal --dtype fp32)

echo "P = $cached cached tokens, N = $ranks ranks (threads backend), ${shape[*]}, --repeat $repeat"
printf '%6s  %-10s %10s %14s %14s %10s %9s\n' T schedule seconds "max sent/rank" "total sent" exposed "wait"
for fresh in 1 64 4096; do
  for schedule in default ring; do
    trace=()
    [[ -n "$trace_dir" ]] && trace=(--trace "$trace_dir/passq_${schedule}_T${fresh}.json")
    out=$("$seqpar" run --strategy passq --schedule "$schedule" --ranks "$ranks" --cached "$cached" \
          --new "$fresh" "${shape[@]}" --repeat "$repeat" --json "${trace[@]}")
    /usr/bin/python3 - "$out" "$fresh" "$schedule" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
label = "allgather" if sys.argv[3] == "default" else "ring"
print("%6s  %-10s %10.4f %14d %14d %10.3f %9.3f" % (
    sys.argv[2], label, d["seconds"], max(d["bytes_sent_per_rank"]),
    sum(d["bytes_sent_per_rank"]), d["exposed_comm_fraction"], d["comm_wait_fraction"]))
PY
  done
done
