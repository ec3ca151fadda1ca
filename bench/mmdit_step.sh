#!/usr/bin/env bash
# Seconds per denoising step of a Qwen-Image- or FLUX.1-dev-shaped checkpoint (seeded bf16 weights
# written by bench/mmdit_checkpoint in diffusers' layout) at 1024x1024 (4096 image tokens, 512
# text tokens), guided (true CFG: two transformer calls a step), on 1 rank (2 threads) and on 2
# ranks (one thread each: Ulysses 2, and cfg 2); beside each, the model FLOP rate against the
# oneDNN fp32 GEMM rate of two threads at once (bench/gemm_bench) measured right before and after
# the run, and the step `seqpar plan --model qwen-image|flux.1-dev --hardware local` predicts for
# the same mesh from a calibration (`seqpar calibrate`) taken just before it. The measured step is
# scaled from the checkpoint's blocks to the model's (60; 19 + 38) by FLOPs (every block costs
# the same).
#
#   bench/mmdit_step.sh [--family qwen-image|flux] [--build DIR] [--layers 2] [--single 0]
#                       [--size 1024] [--text 512] [--dtype bf16|fp32] [--work DIR]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/../build"
family=qwen-image
layers=2
single=0
size=1024
text=512
dtype=bf16
work=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --family) family="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --single) single="$2"; shift 2 ;;
    --layers) layers="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    --text) text="$2"; shift 2 ;;
    --dtype) dtype="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "mmdit_step.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for exe in seqpar bench/gemm_bench bench/mmdit_checkpoint; do
  [[ -x "$build/$exe" ]] || { echo "mmdit_step.sh: $build/$exe not built (cmake --build $build --target seqpar gemm_bench mmdit_checkpoint)" >&2; exit 2; }
done
case "$family" in
  qwen-image) preset=qwen-image ;;
  flux) preset=flux.1-dev ;;
  *) echo "mmdit_step.sh: --family $family: expected qwen-image or flux" >&2; exit 2 ;;
esac
if [[ -z "$work" ]]; then work=$(mktemp -d); trap 'rm -rf "$work"' EXIT; fi

model=$("$build/bench/mmdit_checkpoint" --out "$work" --family "$family" --layers "$layers" \
          --single "$single" --size "$size" --text "$text" --dtype "$dtype")
rows=()
for mesh in "--ranks 1" "--ranks 2 --ulysses-degree 2" "--ranks 2 --cfg 2"; do
  run_mesh=${mesh#--ranks [0-9]}
  "$build/seqpar" calibrate >/dev/null
  # shellcheck disable=SC2086
  plan=$("$build/seqpar" plan --model "$preset" --height "$size" --width "$size" \
           --text-tokens "$text" --hardware local --memory-limit 1000 --dtype fp32 $mesh --json)
  before=$("$build/bench/gemm_bench" --threads 2 --json)
  # shellcheck disable=SC2086
  run=$("$build/seqpar" denoise --model "$work/$family" --inputs "$work/inputs.safetensors" \
          --output "$work/out.safetensors" --guidance 4 $run_mesh --json 2>/dev/null)
  after=$("$build/bench/gemm_bench" --threads 2 --json)
  rows+=("{\"run\": $run, \"plan\": $plan, \"before\": $before, \"after\": $after}")
done

python3 - "$model" "${rows[@]}" <<'PY'
import json, sys
model = json.loads(sys.argv[1])
flops_step = 2 * model["flops_per_call"]  # guided: two transformer calls
outside = model["flops_per_call"] - model["layers"] * model["flops_per_layer"]
full = model["model_layers"]
print(f"{model['family']} shape ({model['dtype']} weights), {model['layers']} blocks, "
      f"{model['tokens']} image tokens + {model['text_tokens']} text tokens, guided step = "
      f"{flops_step / 1e12:.2f} TFLOP")
print()
print(f"| mesh | ranks | s / step | s / step, {full} blocks | predicted, {full} blocks | "
      "predicted / measured | model GFLOP/s | GEMM GFLOP/s before, after | / GEMM rate |")
print("|---|---|---|---|---|---|---|---|---|")
for row in map(json.loads, sys.argv[2:]):
    r, b, a = row["run"], row["before"]["together_gflops"], row["after"]["together_gflops"]
    s = r["seconds"]
    mesh = f"cfg {r['cfg']} x tp {r['tp']} x ring {r['ring_degree']} x ulysses {r['ulysses_degree']}"
    per60 = s / model["flops_per_call"] * (outside + full * model["flops_per_layer"])
    predicted = row["plan"]["meshes"][0]["step_seconds"]
    rate = flops_step / s / 1e9
    print(f"| {mesh} | {r['ranks']} | {s:.1f} | {per60:.0f} | {predicted:.0f} | "
          f"{predicted / per60:.2f} | {rate:.1f} | {b:.1f}, {a:.1f} | {rate / ((a + b) / 2):.2f} |")
PY
