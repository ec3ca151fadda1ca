#!/usr/bin/env bash
# An alternating A/B of seqpar generate on the threads backend: the same run with an environment
# variable at 1 and at 0 (SEQPAR_TEAM_HELP: ranks as threads running each other's chunks while
# they wait, or apart; SEQPAR_TEAM: the rank's thread team, or an OpenMP region per loop, as
# bench/omp_regions.sh --compare runs it), one run of each per round. Prints each run's prefill
# seconds and decode seconds per token, the medians, and the ratio off / on (above 1: on is
# faster) as min / median / max. With --slow-rank, rank r's thread is pinned to CPU r and a busy
# process shares the last rank's CPU, so that one rank runs at about half speed (as a rank on a
# loaded or paused core).
#
#   bench/generate_ab.sh --model DIR --env NAME [--names "on off"] [--build DIR] [--prompt 256]
#                        [--new 8] [--tp 1] [--threads N] [--rounds 5] [--slow-rank]
#                        [-- extra flags of seqpar generate]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/../build"
model=""
env=""
names="on off"
prompt=256
new=8
tp=1
threads=""
rounds=5
slow=0
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --env) env="$2"; shift 2 ;;
    --names) names="$2"; shift 2 ;;
    --prompt) prompt="$2"; shift 2 ;;
    --new) new="$2"; shift 2 ;;
    --tp) tp="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --slow-rank) slow=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "generate_ab.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$model" ]] || { echo "generate_ab.sh: --model DIR is required (a causal LM directory)" >&2; exit 2; }
[[ -n "$env" ]] || { echo "generate_ab.sh: --env NAME is required (e.g. SEQPAR_TEAM_HELP)" >&2; exit 2; }
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "generate_ab.sh: --rounds $rounds; valid: a number from 1" >&2; exit 2; }
read -r on_name off_name <<< "$names"
cpus="$(nproc)"
if ((slow)) && ((tp > cpus)); then
  echo "generate_ab.sh: --slow-rank pins rank r to CPU r: --tp $tp needs $tp CPUs, this machine has $cpus" >&2
  exit 2
fi
make -C "$build" -s seqpar >/dev/null
ids="$(mktemp)"
runs="$(mktemp)"
out="$(mktemp)"
busy=""
trap 'rm -f "$ids" "$runs" "$out"; [[ -z "$busy" ]] || kill "$busy" 2>/dev/null' EXIT
python3 -c "print(','.join(str(i % 1000 + 1) for i in range($prompt)))" > "$ids"
if ((slow)); then
  taskset -c $((tp - 1)) python3 -c "while True: pass" &
  busy=$!
fi

# Pins the rank threads ("seqpar rank R") of process $1 to CPU R once they exist.
pin_ranks() {
  local pid=$1 pinned=0 task name
  while ((pinned < tp)) && kill -0 "$pid" 2>/dev/null; do
    pinned=0
    for task in /proc/"$pid"/task/*; do
      name="$(cat "$task/comm" 2>/dev/null || true)"
      if [[ "$name" =~ ^seqpar\ rank\ ([0-9]+)$ ]]; then
        taskset -p -c "${BASH_REMATCH[1]}" "${task##*/}" >/dev/null && pinned=$((pinned + 1))
      fi
    done
    ((pinned == tp)) || sleep 0.01
  done
}

echo "| round | $env | prefill s | decode s / token |"
echo "|---|---|---|---|"
for ((r = 1; r <= rounds; r++)); do
  for value in 1 0; do
    env "$env=$value" ${threads:+OMP_NUM_THREADS=$threads} "$build/seqpar" generate \
      --model "$model" --prompt-ids-file "$ids" --max-new-tokens "$new" --tp "$tp" --json \
      "${extra[@]}" > "$out" 2>/dev/null &
    run=$!
    if ((slow)); then pin_ranks $run; fi
    wait $run
    python3 -c "import json; d = json.load(open('$out')); \
print($r, $value, d['prefill_seconds'], d['decode_seconds_per_token'])" | tee -a "$runs" |
      awk -v on="$on_name" -v off="$off_name" \
        '{ printf "| %d | %s | %.3f | %.4f |\n", $1, ($2 == 1 ? on : off), $3, $4 }'
  done
done
python3 - "$runs" "$on_name" "$off_name" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1]) if line.strip()]
on_name, off_name = sys.argv[2], sys.argv[3]
print(f"\n| measure | {on_name} (median) | {off_name} (median) | "
      f"{off_name} / {on_name} min / median / max |")
print("|---|---|---|---|")
for col, name in ((2, "prefill s"), (3, "decode s / token")):
    on = {r[0]: float(r[col]) for r in rows if r[1] == "1"}
    off = {r[0]: float(r[col]) for r in rows if r[1] == "0"}
    ratios = sorted(off[k] / on[k] for k in on)
    print(f"| {name} | {statistics.median(on.values()):.4f} | "
          f"{statistics.median(off.values()):.4f} | {ratios[0]:.3f} / "
          f"{statistics.median(ratios):.3f} / {ratios[-1]:.3f} |")
PY
