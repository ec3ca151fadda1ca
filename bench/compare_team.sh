#!/usr/bin/env bash
# seqpar generate with the rank's thread team (core/team.h) beside the same run with an OpenMP
# region per parallel loop (SEQPAR_TEAM=0): one run of each per round, alternating, on one rank
# with THREADS threads. Prints each run's prefill seconds and decode seconds per token, then the
# medians and the ratio (regions / team; above 1: the team is faster) as min / median / max.
#
#   bench/compare_team.sh --model DIR [--build DIR] [--prompt 256] [--new 16] [--threads 2]
#                         [--rounds 5] [-- extra flags of seqpar generate]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/../build"
model=""
prompt=256
new=16
threads=2
rounds=5
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --prompt) prompt="$2"; shift 2 ;;
    --new) new="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "compare_team.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$model" ]] || { echo "compare_team.sh: --model DIR is required (a causal LM directory)" >&2; exit 2; }
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "compare_team.sh: --rounds $rounds; valid: a positive integer" >&2; exit 2; }
ids="$(mktemp)"
runs="$(mktemp)"
trap 'rm -f "$ids" "$runs"' EXIT
python3 -c "print(','.join(str(i % 1000 + 1) for i in range($prompt)))" > "$ids"
echo "| round | form | prefill s | decode s / token |"
echo "|---|---|---|---|"
for ((r = 1; r <= rounds; r++)); do
  for team in 1 0; do
    SEQPAR_TEAM=$team OMP_NUM_THREADS="$threads" "$build/seqpar" generate --model "$model" \
      --prompt-ids-file "$ids" --max-new-tokens "$new" "${extra[@]}" --json 2>/dev/null |
      python3 -c "import json, sys; d = json.load(sys.stdin); \
print($r, $team, d['prefill_seconds'], d['decode_seconds_per_token'])" | tee -a "$runs" |
      awk '{ printf "| %d | %s | %.3f | %.4f |\n", $1, ($2 == 1 ? "team" : "regions"), $3, $4 }'
  done
done
python3 - "$runs" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
print("\n| measure | team (median) | regions (median) | regions / team min / median / max |")
print("|---|---|---|---|")
for col, name in ((2, "prefill s"), (3, "decode s / token")):
    team = {r[0]: float(r[col]) for r in rows if r[1] == "1"}
    regions = {r[0]: float(r[col]) for r in rows if r[1] == "0"}
    ratios = sorted(regions[k] / team[k] for k in team if k in regions)
    print(f"| {name} | {statistics.median(team.values()):.4f} | "
          f"{statistics.median(regions.values()):.4f} | {ratios[0]:.3f} / "
          f"{statistics.median(ratios):.3f} / {ratios[-1]:.3f} |")
PY
