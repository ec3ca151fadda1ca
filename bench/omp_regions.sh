#!/usr/bin/env bash
# OpenMP parallel regions (fork + join of a team of threads) of seqpar generate on one rank: per
# prefill of a P-token prompt (the whole forward pass and the first token) and per decoded token,
# with the rank's thread team (core/team.h) and with SEQPAR_TEAM=0 (a region per parallel loop).
# Counted by an LD_PRELOAD shim (bench/omp_regions.cc), not timed. With --compare ROUNDS, then
# the two timed by bench/generate_ab.sh: one generate of each per round, alternating, each run's
# prefill seconds and decode seconds per token, the medians and the ratio regions / team (above
# 1: the team is faster) as min / median / max.
#
#   bench/omp_regions.sh --model DIR [--build DIR] [--prompt 256] [--new 8] [--threads 2]
#                        [--compare ROUNDS] [-- extra flags of seqpar generate]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/../build"
model=""
prompt=256
new=8
threads=2
rounds=0
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --prompt) prompt="$2"; shift 2 ;;
    --new) new="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --compare) rounds="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "omp_regions.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$model" ]] || { echo "omp_regions.sh: --model DIR is required (a causal LM directory)" >&2; exit 2; }
[[ "$rounds" =~ ^[0-9]+$ ]] || { echo "omp_regions.sh: --compare $rounds; valid: a number of rounds" >&2; exit 2; }
make -C "$build" -s seqpar omp_regions >/dev/null
shim="$build/bench/omp_regions.so"
ids="$(mktemp)"
trap 'rm -f "$ids"' EXIT
python3 -c "print(','.join(str(i % 1000 + 1) for i in range($prompt)))" > "$ids"
generate() {  # SEQPAR_TEAM=$1, $2 new tokens, then any further arguments
  local team=$1 tokens=$2
  shift 2
  SEQPAR_TEAM="$team" OMP_NUM_THREADS="$threads" "$build/seqpar" generate --model "$model" \
    --prompt-ids-file "$ids" --max-new-tokens "$tokens" "${extra[@]}" "$@"
}
count() {  # regions of one generate run with SEQPAR_TEAM=$1 and $2 new tokens
  LD_PRELOAD="$shim" generate "$1" "$2" 2>&1 >/dev/null | sed -n 's/^omp_regions: //p'
}
echo "| prompt | threads | loops run as | regions: prefill + first token | regions per decoded token |"
echo "|---|---|---|---|---|"
for team in 1 0; do
  first="$(count $team 1)"
  more="$(count $team $((new + 1)))"
  awk -v p="$prompt" -v t="$threads" -v a="$first" -v b="$more" -v n="$new" \
    -v form="$([[ $team == 1 ]] && echo "the rank's team" || echo "OpenMP regions (SEQPAR_TEAM=0)")" \
    'BEGIN { printf "| %d | %d | %s | %d | %.1f |\n", p, t, form, a, (b - a) / n }'
done
((rounds > 0)) || exit 0
echo
"$here/generate_ab.sh" --build "$build" --model "$model" --env SEQPAR_TEAM --names "team regions" \
  --prompt "$prompt" --new "$new" --threads "$threads" --rounds "$rounds" -- "${extra[@]}"
