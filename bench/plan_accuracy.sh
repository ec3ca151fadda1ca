#!/usr/bin/env bash
# The cost model against this machine: for ring, allgather, ulysses and usp at 2 and 4 ranks,
# the step time `seqpar plan --hardware local` predicts after `seqpar calibrate` (which writes
# the `local` profile), the time `seqpar run --json` measures (median of its --repeat runs), and
# their ratio. Each measurement is predicted from a calibration taken just before it, and the
# configurations are interleaved over ROUNDS rounds (medians reported), so that load from other
# work on a shared machine hits calibration and run alike. Target: every ratio within
# 0.75..1.25. A benchmark: it prints, it never fails on a ratio.
#
# usage: bench/plan_accuracy.sh [path/to/seqpar]
# env:   SEQ (4096) HEADS (8) HEAD_DIM (128) REPEAT (3) ROUNDS (3)
#        CAUSAL (0; 1 = causal with the zigzag layout)
#        SKIP_CALIBRATE=1: calibrate once at the start only (faster, more exposed to drift)
#        SEQPAR_PROFILE_DIR: where the profile goes (default ~/.config/seqpar)
set -eu
bin=${1:-build/seqpar}
seq=${SEQ:-4096}; heads=${HEADS:-8}; dim=${HEAD_DIM:-128}
repeat=${REPEAT:-3}; rounds=${ROUNDS:-3}; causal=${CAUSAL:-0}
shape=(--seq "$seq" --heads "$heads" --head-dim "$dim")
layout=contiguous
if [ "$causal" = 1 ]; then shape+=(--causal); layout=zigzag; fi

"$bin" calibrate; echo

field() { python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print($1)"; }
configs=()
for ranks in 2 4; do for strategy in ring allgather ulysses usp; do configs+=("$strategy:$ranks"); done; done

# Degrees of each configuration: what seqpar run gets, what seqpar plan is pinned to.
setup() {  # setup strategy ranks -> run_deg plan_strategy plan_deg deg
  run_deg=(); plan_strategy=$1; plan_deg=(); deg="1 x $2"
  case $1 in
    ulysses) deg="$2 x 1" ;;
    usp)
      if [ "$2" = 2 ]; then
        # usp on 2 ranks is one Ulysses group of 2 (ring degree 1): the planner calls it ulysses.
        run_deg=(--ulysses-degree 2 --ring-degree 1); plan_strategy=ulysses; deg="2 x 1"
      else
        run_deg=(--ulysses-degree 2 --ring-degree 2); plan_deg=(--ulysses-degree 2 --ring-degree 2)
        deg="2 x 2"
      fi ;;
  esac
}

declare -A predicted measured
for ((r = 0; r < rounds; r++)); do
  for c in "${configs[@]}"; do
    s=${c%:*}; n=${c#*:}; setup "$s" "$n"
    if [ "${SKIP_CALIBRATE:-0}" != 1 ]; then "$bin" calibrate >/dev/null; fi
    p=$("$bin" plan --hardware local --ranks "$n" "${shape[@]}" --dtype fp32 \
      --strategy "$plan_strategy" "${plan_deg[@]}" --layout "$layout" --no-pad --ulysses-mode uaa \
      --json | field 'd["meshes"][0]["step_seconds"]')
    t=$("$bin" run --strategy "$s" --ranks "$n" "${run_deg[@]}" "${shape[@]}" --layout "$layout" \
      --repeat "$repeat" --json | field 'd["seconds"]')
    predicted[$c]="${predicted[$c]:-} $p"
    measured[$c]="${measured[$c]:-} $t"
  done
done

echo "S=$seq H=$heads D=$dim fp32 $([ "$causal" = 1 ] && echo causal zigzag || echo non-causal contiguous), $rounds rounds x $repeat repeats"
echo
echo "| strategy | ranks | degrees (u x r) | predicted s | measured s | predicted / measured (range over rounds) |"
echo "|---|---|---|---|---|---|"
for c in "${configs[@]}"; do
  s=${c%:*}; n=${c#*:}; setup "$s" "$n"
  python3 - "$s" "$n" "$deg" "${predicted[$c]}" "${measured[$c]}" <<'PY'
import statistics, sys
s, n, deg = sys.argv[1], sys.argv[2], sys.argv[3]
pred = [float(x) for x in sys.argv[4].split()]
meas = [float(x) for x in sys.argv[5].split()]
ratios = [p / m for p, m in zip(pred, meas)]
print(f"| {s} | {n} | {deg} | {statistics.median(pred):.4g} | {statistics.median(meas):.4g} | "
      f"{statistics.median(ratios):.2f} ({min(ratios):.2f}..{max(ratios):.2f}) |")
PY
done
