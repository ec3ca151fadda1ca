#!/usr/bin/env bash
# OpenMP parallel regions (fork + join of a rank's thread team) of seqpar generate on one rank:
# per prefill of a P-token prompt (the whole forward pass and the first token) and per decoded
# token. Counted by an LD_PRELOAD shim (bench/omp_regions.cc), not timed.
#
#   bench/omp_regions.sh --model DIR [--build DIR] [--prompt 256] [--new 8] [--threads 2]
#                        [-- extra flags of seqpar generate]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/../build"
model=""
prompt=256
new=8
threads=2
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --prompt) prompt="$2"; shift 2 ;;
    --new) new="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "omp_regions.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$model" ]] || { echo "omp_regions.sh: --model DIR is required (a causal LM directory)" >&2; exit 2; }
make -C "$build" -s seqpar omp_regions >/dev/null
shim="$build/bench/omp_regions.so"
ids="$(mktemp)"
trap 'rm -f "$ids"' EXIT
python3 -c "print(','.join(str(i % 1000 + 1) for i in range($prompt)))" > "$ids"
count() {  # regions of one generate run with $1 new tokens
  LD_PRELOAD="$shim" OMP_NUM_THREADS="$threads" "$build/seqpar" generate --model "$model" \
    --prompt-ids-file "$ids" --max-new-tokens "$1" "${extra[@]}" 2>&1 >/dev/null |
    sed -n 's/^omp_regions: //p'
}
first="$(count 1)"
more="$(count $((new + 1)))"
echo "| prompt | threads | regions: prefill + first token | regions per decoded token |"
echo "|---|---|---|---|"
awk -v p="$prompt" -v t="$threads" -v a="$first" -v b="$more" -v n="$new" \
  'BEGIN { printf "| %d | %d | %d | %.1f |\n", p, t, a, (b - a) / n }'
