#!/usr/bin/env bash
# Seconds per denoising step of a Qwen-Image-shaped checkpoint (seeded bf16 weights written by
# bench/qwen_image_checkpoint in diffusers' layout) at 1024x1024 (4096 image tokens, 512 text
# tokens), guided (true CFG: two transformer calls a step), on 1 rank (2 threads) and on 2 ranks
# (one thread each: Ulysses 2, and cfg 2); beside each, the model FLOP rate against the oneDNN
# fp32 GEMM rate of two threads at once (bench/gemm_bench) measured right before and after the
# run, and the step `seqpar plan --model qwen-image --hardware local` predicts for the same mesh
# from a calibration (`seqpar calibrate`) taken just before it. The measured step is scaled from
# --layers blocks to Qwen-Image's 60 by FLOPs (every block costs the same).
#
#   bench/qwen_image_step.sh [--build DIR] [--layers 2] [--size 1024] [--text 512]
#                            [--dtype bf16|fp32] [--work DIR]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/../build"
layers=2
size=1024
text=512
dtype=bf16
work=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --layers) layers="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    --text) text="$2"; shift 2 ;;
    --dtype) dtype="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "qwen_image_step.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for exe in seqpar bench/gemm_bench bench/qwen_image_checkpoint; do
  [[ -x "$build/$exe" ]] || { echo "qwen_image_step.sh: $build/$exe not built (cmake --build $build --target seqpar gemm_bench qwen_image_checkpoint)" >&2; exit 2; }
done
if [[ -z "$work" ]]; then work=$(mktemp -d); trap 'rm -rf "$work"' EXIT; fi

model=$("$build/bench/qwen_image_checkpoint" --out "$work" --layers "$layers" --size "$size" \
          --text "$text" --dtype "$dtype")
rows=()
for mesh in "--ranks 1" "--ranks 2 --ulysses-degree 2" "--ranks 2 --cfg 2"; do
  run_mesh=${mesh#--ranks [0-9]}
  "$build/seqpar" calibrate >/dev/null
  # shellcheck disable=SC2086
  plan=$("$build/seqpar" plan --model qwen-image --height "$size" --width "$size" \
           --text-tokens "$text" --hardware local --memory-limit 1000 --dtype fp32 $mesh --json)
  before=$("$build/bench/gemm_bench" --threads 2 --json)
  # shellcheck disable=SC2086
  run=$("$build/seqpar" denoise --model "$work/qwen-image" --inputs "$work/inputs.safetensors" \
          --output "$work/out.safetensors" --guidance 4 $run_mesh --json 2>/dev/null)
  after=$("$build/bench/gemm_bench" --threads 2 --json)
  rows+=("{\"run\": $run, \"plan\": $plan, \"before\": $before, \"after\": $after}")
done

python3 - "$model" "${rows[@]}" <<'PY'
import json, sys
model = json.loads(sys.argv[1])
flops_step = 2 * model["flops_per_call"]  # guided: two transformer calls
outside = model["flops_per_call"] - model["layers"] * model["flops_per_layer"]
print(f"Qwen-Image shape ({model['dtype']} weights), {model['layers']} blocks, {model['tokens']} image tokens + "
      f"{model['text_tokens']} text tokens, guided step = {flops_step / 1e12:.2f} TFLOP")
print()
print("| mesh | ranks | s / step | s / step, 60 blocks | predicted, 60 blocks | predicted / measured "
      "| model GFLOP/s | GEMM GFLOP/s before, after | / GEMM rate |")
print("|---|---|---|---|---|---|---|---|---|")
for row in map(json.loads, sys.argv[2:]):
    r, b, a = row["run"], row["before"]["together_gflops"], row["after"]["together_gflops"]
    s = r["seconds"]
    mesh = f"cfg {r['cfg']} x tp {r['tp']} x ring {r['ring_degree']} x ulysses {r['ulysses_degree']}"
    per60 = s / model["flops_per_call"] * (outside + 60 * model["flops_per_layer"])
    predicted = row["plan"]["meshes"][0]["step_seconds"]
    rate = flops_step / s / 1e9
    print(f"| {mesh} | {r['ranks']} | {s:.1f} | {per60:.0f} | {predicted:.0f} | "
          f"{predicted / per60:.2f} | {rate:.1f} | {b:.1f}, {a:.1f} | {rate / ((a + b) / 2):.2f} |")
PY
