#!/usr/bin/env bash
# Seconds per denoising step of a Wan 2.1 T2V 1.3B-shaped checkpoint (seeded weights written by
# bench/wan_checkpoint in Wan's original layout, fp32) at 33 frames of 240x432 (3645 tokens, 512
# text tokens), guided (two transformer calls a step), on 1 rank (2 threads) and on 2 ranks (one
# thread each: Ulysses 2, and cfg 2), with the model FLOP rate beside the oneDNN fp32 GEMM rate of
# two threads at once (bench/gemm_bench) measured right before and after each run.
#
#   bench/wan_step.sh [--build DIR] [--layers 30] [--steps 2] [--work DIR]
#
# --layers: blocks of the checkpoint (Wan 2.1 1.3B has 30; fewer for a shorter run, every block
# costs the same). A step's time is the fastest of --steps steps (the first includes warm-up).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/../build"
layers=30
steps=2
work=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --layers) layers="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "wan_step.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for exe in seqpar bench/gemm_bench bench/wan_checkpoint; do
  [[ -x "$build/$exe" ]] || { echo "wan_step.sh: $build/$exe not built (cmake --build $build --target seqpar gemm_bench wan_checkpoint)" >&2; exit 2; }
done
if [[ -z "$work" ]]; then work=$(mktemp -d); trap 'rm -rf "$work"' EXIT; fi

model=$("$build/bench/wan_checkpoint" --out "$work" --layers "$layers")
# Each run between two GEMM measurements: this machine's speed drifts, so each row's ratio uses the
# GEMM rate measured around it.
rows=()
for mesh in "" "--ulysses-degree 2" "--cfg 2"; do
  before=$("$build/bench/gemm_bench" --threads 2 --json)
  # shellcheck disable=SC2086
  run=$("$build/seqpar" denoise --model "$work/wan" --inputs "$work/inputs.safetensors" \
          --output "$work/out.safetensors" --steps "$steps" --guidance 5 --shift 5 $mesh --json \
          2>/dev/null)
  after=$("$build/bench/gemm_bench" --threads 2 --json)
  rows+=("{\"run\": $run, \"before\": $before, \"after\": $after}")
done

python3 - "$model" "${rows[@]}" <<'PY'
import json, sys
model = json.loads(sys.argv[1])
flops_step = 2 * model["flops_per_call"]  # guided: two transformer calls
outside = model["flops_per_call"] - model["layers"] * model["flops_per_layer"]
print(f"Wan 2.1 1.3B shape, {model['layers']} blocks, {model['tokens']} tokens + "
      f"{model['text_tokens']} text tokens, guided step = {flops_step / 1e12:.2f} TFLOP")
print()
print("| mesh | ranks | s / step | s / step, 30 blocks | model GFLOP/s | GEMM GFLOP/s before, after "
      "| / GEMM rate |")
print("|---|---|---|---|---|---|---|")
for row in map(json.loads, sys.argv[2:]):
    r, b, a = row["run"], row["before"]["together_gflops"], row["after"]["together_gflops"]
    s = min(r["step_seconds"])
    mesh = f"cfg {r['cfg']} x tp {r['tp']} x ring {r['ring_degree']} x ulysses {r['ulysses_degree']}"
    per30 = s / model["flops_per_call"] * (outside + 30 * model["flops_per_layer"])
    rate = flops_step / s / 1e9
    print(f"| {mesh} | {r['ranks']} | {s:.2f} | {per30:.0f} | {rate:.1f} | {b:.1f}, {a:.1f} | "
          f"{rate / ((a + b) / 2):.2f} |")
PY
