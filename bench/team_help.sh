#!/usr/bin/env bash
# Ranks as threads running each other's chunks while they wait (core/team.h's TeamBoard) against
# ranks kept apart (SEQPAR_TEAM_HELP=0): seqpar generate on a tp x 1 mesh of the threads backend,
# one run of each per round, alternating; each run's prefill seconds and decode seconds per
# token, the medians, and the ratio apart / helping (above 1: helping is faster) as min / median
# / max. With --slow-rank, rank r's thread is pinned to CPU r and a busy process shares the last
# rank's CPU, so that one rank runs at about half speed (as a rank on a loaded or paused core).
#
#   bench/team_help.sh --model DIR [--build DIR] [--prompt 256] [--new 8] [--tp 2]
#                      [--rounds 5] [--slow-rank] [-- extra flags of seqpar generate]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/../build"
model=""
prompt=256
new=8
tp=2
rounds=5
slow=0
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --prompt) prompt="$2"; shift 2 ;;
    --new) new="$2"; shift 2 ;;
    --tp) tp="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --slow-rank) slow=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "team_help.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$model" ]] || { echo "team_help.sh: --model DIR is required (a causal LM directory)" >&2; exit 2; }
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "team_help.sh: --rounds $rounds; valid: a number from 1" >&2; exit 2; }
cpus="$(nproc)"
if ((slow)) && ((tp > cpus)); then
  echo "team_help.sh: --slow-rank pins rank r to CPU r: --tp $tp needs $tp CPUs, this machine has $cpus" >&2
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

echo "| round | ranks | prefill s | decode s / token |"
echo "|---|---|---|---|"
for ((r = 1; r <= rounds; r++)); do
  for help in 1 0; do
    SEQPAR_TEAM_HELP=$help "$build/seqpar" generate --model "$model" --prompt-ids-file "$ids" \
      --max-new-tokens "$new" --tp "$tp" --json "${extra[@]}" > "$out" 2>/dev/null &
    run=$!
    if ((slow)); then pin_ranks $run; fi
    wait $run
    python3 -c "import json, sys; d = json.load(open('$out')); \
print($r, $help, d['prefill_seconds'], d['decode_seconds_per_token'])" | tee -a "$runs" |
      awk '{ printf "| %d | %s | %.3f | %.4f |\n", $1, ($2 == 1 ? "helping" : "apart"), $3, $4 }'
  done
done
python3 "$here/ab_summary.py" "$runs" helping apart
