#!/usr/bin/env bash
# Overlap of communication with compute in ring attention: exposed_comm_fraction (per rank, the
# median over the timed runs of time blocked in communication during the ring steps / call time;
# the table shows the worst rank) on the threads backend (zero copy) and under MPI, for shards of
# S/N >= 2048 tokens. end_sync_fraction is the zero-copy ring's wait after its last step for the
# peers still reading its K/V (the skew between ranks; 0 under MPI, where that idle time falls
# outside the call).
#
#   bench/overlap.sh [--build DIR] [--backend threads|mpi|both] [--repeat 3] [--trace-dir DIR]
#
# With --trace-dir, each run also writes a Chrome/Perfetto trace there (open in ui.perfetto.dev).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/../build"
backend=both
repeat=3
trace_dir=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --backend) backend="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    --trace-dir) trace_dir="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "overlap.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
seqpar="$build/seqpar"
[[ -x "$seqpar" ]] || { echo "overlap.sh: $seqpar not built" >&2; exit 2; }
py=/usr/bin/python3
backends=("$backend")
[[ "$backend" == both ]] && backends=(threads mpi)
[[ -n "$trace_dir" ]] && mkdir -p "$trace_dir"

# ranks seq layout causal (4 ranks: more ranks than cores on a 2-core machine, so ranks also wait
# for a core, not only for data)
configs=(
  "2 4096 contiguous 0"
  "2 8192 contiguous 0"
  "2 16384 contiguous 0"
  "2 8192 zigzag 1"
  "2 16384 zigzag 1"
  "4 16384 zigzag 1"
)
read -r -d '' row_py <<'PY' || true
import json, sys
j = json.loads(sys.argv[1])
per = " ".join(f"{x:.3f}" for x in j["exposed_comm_fraction_per_rank"])
causal = "yes" if j["causal"] else "no"
print(f"| {j['backend']} | {j['ranks']} | {j['seq']} | {j['seq'] // j['ranks']} | {j['layout']} | "
      f"{causal} | {j['gflops']:.1f} | {j['exposed_comm_fraction']:.3f} | {per} | "
      f"{j['end_sync_fraction']:.3f} | {j['work_imbalance']:.3f} |")
PY
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| backend | ranks | S | S/N | layout | causal | GFLOP/s | exposed comm (worst rank) | per rank | end-of-call sync (worst rank) | work imbalance |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for be in "${backends[@]}"; do
  for cfg in "${configs[@]}"; do
    read -r n seq layout causal <<<"$cfg"
    args=(run --strategy ring --layout "$layout" --seq "$seq" --heads 8 --head-dim 128
          --threads 1 --repeat "$repeat" --json)
    [[ "$causal" == 1 ]] && args+=(--causal)
    [[ -n "$trace_dir" ]] && args+=(--trace "$trace_dir/ring_${be}_n${n}_s${seq}_${layout}$([[ $causal == 1 ]] && echo _causal || true).json")
    if [[ "$be" == mpi ]]; then
      m=(mpirun -np "$n" --oversubscribe)
      [[ $(id -u) -eq 0 ]] && m+=(--allow-run-as-root)
      j="$("${m[@]}" "$seqpar" "${args[@]}" --backend mpi)"
    else
      j="$("$seqpar" "${args[@]}" --ranks "$n")"
    fi
    "$py" -c "$row_py" "$j"
  done
done
echo
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
