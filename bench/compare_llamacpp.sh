#!/usr/bin/env bash
# seqpar side by side with llama.cpp on the same Llama weights, interleaved, CPU only. A benchmark:
# no build or test target calls it, and nothing here passes or fails on timing.
#
#   bench/compare_llamacpp.sh [--build DIR] [--rounds 5] [--prompts "256 2048"] [--decode 16]
#                             [--quick] [--threads 2] [--model DIR] [--out FILE] [--no-check]
#                             [--weights "bf16 int8"] [--kv-cache fp32|bf16|fp16] [--isa avx2]
#
# What it runs:
# - Weights: a Hugging Face bf16 directory (default /tmp/seqpar_llama3.2-1b_bf16, Llama 3.2 1B's
#   config with seeded weights, written once by build/bench/llama_bench if missing) for seqpar,
#   and the same weights as GGUF F32, BF16 and Q8_0 for llama.cpp (bench/llamacpp_gguf.py, into
#   DIR-gguf/, written once).
# - llama.cpp: llama-cpp-python's source package from PyPI (version $LLAMACPP_VERSION, default
#   0.3.36; `pip download --no-binary llama-cpp-python`), which vendors llama.cpp, built once
#   CPU-only (GGML_NATIVE, OpenMP, CMAKE_BUILD_PARALLEL_LEVEL=2) into its own venv under
#   ${SEQPAR_BENCH_CACHE:-~/.cache/seqpar-bench}/llamacpp/VERSION/ and reused afterwards (about 12
#   minutes the first time on 2 cores). The runs go through its C API from Python
#   (bench/llamacpp_run.py), the GGUF writer is the vendored gguf-py.
# - Correctness, once: a 16-token prompt, 8 greedy tokens, seqpar (1 rank) on the bf16
#   directory against llama.cpp on the F32 GGUF with an F32 K/V cache and flash attention off
#   (with flash attention llama.cpp casts F32 K/V to f16 first, llama-graph.cpp; that run is
#   reported too): max |logit difference| at the prompt's last position and up to the first
#   token where they part, token agreement.
# - Timing: for each prompt length P (ids (i * 7919 + 13) mod vocab, as llama_bench) and each
#   round, one process each, in this order: seqpar 1 rank x 2 threads, llama.cpp BF16, seqpar tp 2
#   (2 ranks as threads, 1 thread each), then, if `seqpar generate --help` lists --activations,
#   seqpar with bf16 activations (1 rank, tp 2; against the same llama.cpp BF16 run), and, if it
#   lists --weights-dtype, seqpar int8 (1 rank, tp 2) and llama.cpp Q8_0, and with both flags
#   seqpar int8-channel with bf16 activations (1 rank, tp 2; against the same Q8_0 run: int8
#   weights on both sides, llama.cpp's activations rounded to int8 blocks), and, if
#   --activations takes int8, seqpar int8-channel with int8 activations (1 rank, tp 2; against the
#   same Q8_0 run: int8 x int8 products on both sides), and, if it takes them with Q8_0 weights
#   too, seqpar int8 with int8 activations (1 rank, tp 2; against the same Q8_0 run: the same
#   weights and the activations in int8 blocks of 32 on both sides). --weights chooses the
#   groups: bf16 (the BF16 runs and theirs) and int8 (the Q8_0 runs and theirs), both by default.
#   Each generates --decode + 1 tokens: the prompt's pass gives the first, then --decode
#   one-token passes.
#   Prefill and decode seconds come from each program's own clock (seqpar generate --json,
#   llamacpp_run.py's JSON: same boundaries, no warm-up pass on either side); peak RSS from
#   /usr/bin/time (the process: all ranks for seqpar; for llama.cpp the mapped GGUF pages it
#   touched, plus the Python interpreter, about 40 MB).
# - Ratios: seqpar throughput / llama.cpp throughput, per round against the same round's
#   llama.cpp run (> 1: seqpar faster); the table gives their min and median over the rounds.
# - The read ceiling: before each round and after the last, build/bench/read_bench measures this
#   machine's streaming read rate on --threads threads (a sum over 1 GiB). A decoded token reads
#   every weight once, so read rate / weight bytes (the BF16 or Q8_0 GGUF's size) is the most
#   tokens/s a decode can reach; the table gives each side's decode as a share of it (median over
#   the rounds, each against the rate read before it) for the BF16 and Q8_0 weights.
#
# - K/V cache: llama.cpp keeps its cache in f16 (its default); seqpar's timing runs keep theirs in
#   --kv-cache (seqpar generate --kv-cache-dtype; default fp32: twice llama.cpp's bytes; fp16 is
#   llama.cpp's precision). The correctness check keeps fp32 on both sides.
#
# - --isa avx2: both programs as on a CPU with AVX2 alone (AVX, AVX2, FMA, F16C; the developer
#   machines without AVX-512), on a CPU with more: llama.cpp built without GGML_NATIVE (its
#   defaults then: SSE 4.2, AVX, AVX2, BMI2, FMA, F16C; no AVX-512, AVX-VNNI or AMX) into its
#   own venv (venv-avx2 beside the other, built once), seqpar run with SEQPAR_KERNEL_ISA=avx2
#   and ONEDNN_MAX_CPU_ISA=AVX2. The streaming read rate is the machine's either way.
#
# llama.cpp runs with --threads threads (default 2); seqpar with its own rule (hardware threads /
# ranks), which is 2 and 1 on a 2-core machine; elsewhere the script says the counts differ.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="$root/build"
rounds=5
prompts="256 2048"
decode=16
threads=2
model="/tmp/seqpar_llama3.2-1b_bf16"
out=""
check=1
groups="bf16 int8"
kv_cache=fp32
isa=native
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --prompts) prompts="$2"; shift 2 ;;
    --decode) decode="$2"; shift 2 ;;
    --quick) rounds=2; prompts="256"; shift ;;
    --threads) threads="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --no-check) check=0; shift ;;
    --weights) groups="$2"; shift 2 ;;
    --kv-cache) kv_cache="$2"; shift 2 ;;
    --isa) isa="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare_llamacpp: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
die() { echo "compare_llamacpp: $*" >&2; exit 1; }
case "$isa" in
  native) ;;
  avx2) export SEQPAR_KERNEL_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ;;
  *) echo "compare_llamacpp: --isa '$isa' is invalid; valid: avx2 (or leave it out)" >&2; exit 2 ;;
esac
[[ -x "$build/seqpar" ]] || die "no $build/seqpar (build seqpar first)"
work="$(mktemp -d /tmp/compare_llamacpp.XXXXXX)"
# A copy, so that a rebuild of $build during the run cannot mix two builds across rounds.
seqpar="$work/seqpar"
cp -p "$build/seqpar" "$seqpar"
[[ -x /usr/bin/time ]] || die "needs /usr/bin/time (apt-get install time)"
[[ -x "$build/bench/read_bench" ]] || die "no $build/bench/read_bench (build seqpar first)"

# --- llama.cpp, built once ----------------------------------------------------------------------
version="${LLAMACPP_VERSION:-0.3.36}"
cache="${SEQPAR_BENCH_CACHE:-$HOME/.cache/seqpar-bench}/llamacpp/$version"
venv="$cache/venv"
[[ "$isa" == native ]] || venv="$cache/venv-$isa"
src="$cache/llama_cpp_python-$version"
py="$venv/bin/python"
if ! [[ -x "$py" ]] || ! "$py" -c "import llama_cpp" 2>/dev/null; then
  echo "compare_llamacpp: building llama-cpp-python $version (CPU, -j2) into $venv" >&2
  mkdir -p "$cache"
  [[ -x "$py" ]] || python3 -m venv "$venv"
  sdist="$cache/llama_cpp_python-$version.tar.gz"
  if ! [[ -f "$sdist" ]]; then
    # --no-binary for this package only: ':all:' would build its build tools (CMake) from source.
    "$venv/bin/pip" download --no-deps --no-binary llama-cpp-python -d "$cache" \
      "llama-cpp-python==$version" >&2
  fi
  [[ -d "$src" ]] || tar -xzf "$sdist" -C "$cache"
  flags="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
  [[ "$isa" == native ]] && flags+=" -DGGML_NATIVE=ON" || flags+=" -DGGML_NATIVE=OFF"
  flags+=" -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
  CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL=2 \
    "$venv/bin/pip" install --no-cache-dir "$sdist" >&2
fi
# gguf-py (the converter's writer) imports yaml
"$py" -c "import yaml" 2>/dev/null || "$venv/bin/pip" install --no-cache-dir pyyaml >&2
gguf_py="$src/vendor/llama.cpp/gguf-py"
[[ -d "$gguf_py" ]] || tar -xzf "$cache/llama_cpp_python-$version.tar.gz" -C "$cache"

# --- weights ------------------------------------------------------------------------------------
if ! [[ -f "$model/config.json" ]]; then
  echo "compare_llamacpp: writing $model (llama_bench: seeded Llama 3.2 1B, bf16)" >&2
  "$build/bench/llama_bench" --dir "$model" --prompt 8 --decode 1 >/dev/null
fi
gguf_dir="${model%/}-gguf"
"$py" "$here/llamacpp_gguf.py" --model "$model" --out "$gguf_dir" --gguf-py "$gguf_py" --check-q8

results="$work/results.jsonl"
: >"$results"
vocab="$("$py" -c "import json, sys; print(json.load(open(sys.argv[1]))['vocab_size'])" \
  "$model/config.json")"
ids() {  # P -> file of P token ids, as llama_bench
  "$py" -c "import sys; P, V = map(int, sys.argv[1:]);
print(','.join(str((i * 7919 + 13) % V) for i in range(P)))" "$1" "$vocab" >"$work/prompt_$1.txt"
  echo "$work/prompt_$1.txt"
}

cores="$(nproc --all)"
if [[ "$cores" != "$threads" ]]; then
  echo "compare_llamacpp: note: seqpar uses $cores threads on 1 rank ($((cores / 2)) a rank on" \
    "tp 2), llama.cpp $threads" >&2
fi
# The help read whole first: under pipefail, `seqpar ... | grep -q` fails when grep stops reading
# before seqpar has written everything (seqpar then dies of SIGPIPE), and the rows were skipped.
gen_help="$("$seqpar" generate --help 2>/dev/null || true)"
int8=0
if grep -q -- "--weights-dtype" <<<"$gen_help"; then int8=1; fi
act=0
if grep -q -- "--activations" <<<"$gen_help"; then act=1; fi
act8=0
if grep -q -- "bf16 | int8" <<<"$gen_help"; then act8=1; fi
act8_q8=0
if grep -q -- "per block of 32" <<<"$gen_help"; then act8_q8=1; fi
if [[ "$kv_cache" != fp32 ]] && ! grep -q -- "--kv-cache-dtype" <<<"$gen_help"; then
  echo "compare_llamacpp: --kv-cache $kv_cache: this seqpar has no --kv-cache-dtype" >&2
  exit 2
fi
bf16_group=0
[[ " $groups " == *" bf16 "* ]] && bf16_group=1
[[ " $groups " == *" int8 "* ]] || int8=0

# --- correctness on the F32 GGUF ----------------------------------------------------------------
if [[ "$check" == 1 ]]; then
  p16="$(ids 16)"
  "$seqpar" generate --model "$model" --prompt-ids-file "$p16" --max-new-tokens 8 --ignore-eos \
    --json --quiet --output "$work/check_seqpar.safetensors" >"$work/check_seqpar.json"
  for fa in off auto; do
    "$py" "$here/llamacpp_run.py" generate --model "$gguf_dir/model-f32.gguf" \
      --prompt-ids-file "$p16" --max-new-tokens 8 --threads "$threads" --kv-type f32 \
      --flash-attn "$fa" \
      --output "$work/check_llamacpp_fa_$fa.npz" >"$work/check_llamacpp_fa_$fa.json"
    "$py" "$here/llamacpp_run.py" compare --seqpar "$work/check_seqpar.safetensors" \
      --llamacpp "$work/check_llamacpp_fa_$fa.npz" >"$work/check_fa_$fa.json"
  done
fi

# --- timing, interleaved ------------------------------------------------------------------------
# run ROUND P SIDE CONFIG CMD...: one timed process, its JSON and peak RSS appended to results.
run() {
  local round="$1" P="$2" side="$3" config="$4"; shift 4
  local log="$work/run.json" rss="$work/rss.txt"
  /usr/bin/time -f "%M" -o "$rss" "$@" >"$log"
  "$py" - "$log" "$rss" "$round" "$P" "$side" "$config" >>"$results" <<'EOF'
import json, sys
log, rss, round_, P, side, config = sys.argv[1:]
j = json.loads(open(log).read().strip().splitlines()[-1])
print(json.dumps({"round": int(round_), "prompt": int(P), "side": side, "config": config,
                  "prefill_s": j["prefill_seconds"],
                  "decode_s_per_token": j["decode_seconds_per_token"],
                  "rss_bytes": int(open(rss).read().split()[-1]) * 1024,
                  "tokens": j["tokens"]}))
EOF
  echo "compare_llamacpp: round $round, P $P, $side $config:" \
    "$(tail -n 1 "$results" | cut -c1-160)" >&2
}
sp=("$seqpar" generate --model "$model" --max-new-tokens "$((decode + 1))" --ignore-eos --json
    --quiet)
[[ "$kv_cache" == fp32 ]] || sp+=(--kv-cache-dtype "$kv_cache")
lc=("$py" "$here/llamacpp_run.py" generate --max-new-tokens "$((decode + 1))" --threads "$threads")
for P in $prompts; do ids "$P" >/dev/null; done
# llama.cpp's Q8_0 weights repacked for AMX (its AMX buffer type, chosen where the CPU has AMX)
# end in a general protection fault in libggml-cpu on some machines (llama-cpp-python 0.3.36);
# probed once with a 2-token prompt, and if it crashes the Q8_0 runs keep plain CPU buffers.
q8_flags=()
if [[ "$int8" == 1 ]]; then
  ids 2 >/dev/null
  if ! "${lc[@]}" --prompt-ids-file "$work/prompt_2.txt" --max-new-tokens 1 \
      --model "$gguf_dir/model-q8_0.gguf" >/dev/null 2>&1; then
    q8_flags=(--no-extra-bufts)
    echo "compare_llamacpp: llama.cpp's Q8_0 run with its repacked (AMX) weights failed here;" \
      "the Q8_0 runs use plain CPU buffers (--no-extra-bufts)" >&2
  fi
fi
# read ROUND: this machine's streaming read rate now, appended to results.
read_rate() {
  "$build/bench/read_bench" --threads "$threads" --rounds 1 --min-time 0.3 --json |
    "$py" -c "import json, sys; j = json.loads(sys.stdin.read());
print(json.dumps({'round': int(sys.argv[1]), 'side': 'read', 'read_gbs': j['read_gb_per_s']}))" \
      "$1" >>"$results"
  echo "compare_llamacpp: before round $1: $(tail -n 1 "$results")" >&2
}
start="$(date -u +%H:%M) UTC, load average $(cut -d' ' -f1 /proc/loadavg)"
for round in $(seq 1 "$rounds"); do
  read_rate "$round"
  for P in $prompts; do
    f="$work/prompt_$P.txt"
    if [[ "$bf16_group" == 1 ]]; then
      run "$round" "$P" seqpar "1x2 bf16" "${sp[@]}" --prompt-ids-file "$f"
      run "$round" "$P" llama.cpp "bf16" "${lc[@]}" --prompt-ids-file "$f" \
        --model "$gguf_dir/model-bf16.gguf"
      run "$round" "$P" seqpar "tp2 bf16" "${sp[@]}" --prompt-ids-file "$f" --tp 2
      if [[ "$act" == 1 ]]; then
        run "$round" "$P" seqpar "1x2 bf16 act" "${sp[@]}" --prompt-ids-file "$f" \
          --activations bf16
        run "$round" "$P" seqpar "tp2 bf16 act" "${sp[@]}" --prompt-ids-file "$f" --tp 2 \
          --activations bf16
      fi
    fi
    if [[ "$int8" == 1 ]]; then
      run "$round" "$P" seqpar "1x2 int8" "${sp[@]}" --prompt-ids-file "$f" --weights-dtype int8
      run "$round" "$P" llama.cpp "q8_0" "${lc[@]}" --prompt-ids-file "$f" \
        --model "$gguf_dir/model-q8_0.gguf" "${q8_flags[@]}"
      run "$round" "$P" seqpar "tp2 int8" "${sp[@]}" --prompt-ids-file "$f" --tp 2 \
        --weights-dtype int8
      if [[ "$act" == 1 ]]; then
        run "$round" "$P" seqpar "1x2 int8-ch bf16 act" "${sp[@]}" --prompt-ids-file "$f" \
          --weights-dtype int8-channel --activations bf16
        run "$round" "$P" seqpar "tp2 int8-ch bf16 act" "${sp[@]}" --prompt-ids-file "$f" \
          --tp 2 --weights-dtype int8-channel --activations bf16
      fi
      if [[ "$act8" == 1 ]]; then
        run "$round" "$P" seqpar "1x2 int8-ch int8 act" "${sp[@]}" --prompt-ids-file "$f" \
          --weights-dtype int8-channel --activations int8
        run "$round" "$P" seqpar "tp2 int8-ch int8 act" "${sp[@]}" --prompt-ids-file "$f" \
          --tp 2 --weights-dtype int8-channel --activations int8
      fi
      if [[ "$act8_q8" == 1 ]]; then
        run "$round" "$P" seqpar "1x2 int8 int8 act" "${sp[@]}" --prompt-ids-file "$f" \
          --weights-dtype int8 --activations int8
        run "$round" "$P" seqpar "tp2 int8 int8 act" "${sp[@]}" --prompt-ids-file "$f" \
          --tp 2 --weights-dtype int8 --activations int8
      fi
    fi
  done
done

read_rate "$((rounds + 1))"

# --- table --------------------------------------------------------------------------------------
report="$work/report.md"
end="$(date -u +%H:%M) UTC, load average $(cut -d' ' -f1 /proc/loadavg)"
sp_build="seqpar $("$seqpar" --version 2>&1 | head -n 1)"
sp_build+=" (build of $(date -u -r "$seqpar" '+%F %H:%M') UTC)"
"$py" - "$results" "$work/check_fa_off.json" "$work/check_fa_auto.json" "$int8" "$rounds" \
  "$decode" "$threads" "$cores" "$version" "$sp_build" \
  "$start" "$end" "${q8_flags[*]:-}" "$gguf_dir" "$kv_cache" "$isa" >"$report" <<'EOF'
import json, os, statistics, sys
(results, check, check_fa, int8, rounds, decode, threads, cores, version, sp_version, start,
 end, q8_flags, gguf_dir, kv_cache, isa) = sys.argv[1:]
every = [json.loads(l) for l in open(results)]
read = {r["round"]: r["read_gbs"] for r in every if r["side"] == "read"}
rows = [r for r in every if r["side"] != "read"]
# Bytes a decoded token reads: the weights, as the GGUF of their precision holds them.
weight_bytes = {w: os.path.getsize(os.path.join(gguf_dir, f"model-{w}.gguf")) for w in ("bf16", "q8_0")}
def bytes_of(config):  # seqpar's config or llama.cpp's; None where the weights are neither
    if config in weight_bytes:
        return weight_bytes[config]
    if "int8-ch" in config:
        return None
    return weight_bytes["q8_0" if "int8" in config else "bf16"]
med = statistics.median
print(f"{sp_version} vs llama.cpp (llama-cpp-python {version}), {rounds} rounds, {decode} decoded "
      f"tokens, llama.cpp {threads} threads, {cores} hardware threads; from {start} to {end}. "
      "Ratio: seqpar throughput / llama.cpp throughput against the same round's llama.cpp run "
      f"(> 1: seqpar faster). K/V cache: seqpar {kv_cache}, llama.cpp f16.\n")
if isa != "native":
    print(f"Both programs as on a CPU with {isa.upper()} alone: llama.cpp built without "
          "GGML_NATIVE (AVX, AVX2, FMA, F16C, BMI2), seqpar with SEQPAR_KERNEL_ISA=avx2 and "
          "ONEDNN_MAX_CPU_ISA=AVX2.\n")
if q8_flags:
    print(f"llama.cpp's Q8_0 runs: {q8_flags} (its AMX-repacked Q8_0 weights crashed on this "
          "machine).\n")
print("| P | seqpar | llama.cpp | prefill tok/s seqpar / llama.cpp | prefill ratio min / median "
      "| decode tok/s seqpar / llama.cpp | decode ratio min / median | decode of the read ceiling "
      "seqpar / llama.cpp | peak RSS seqpar / llama.cpp (GB) |")
print("|---|---|---|---|---|---|---|---|---|")
pairs = [("1x2 bf16", "bf16"), ("tp2 bf16", "bf16"), ("1x2 bf16 act", "bf16"),
         ("tp2 bf16 act", "bf16")]
if int8 == "1":
    pairs += [("1x2 int8", "q8_0"), ("tp2 int8", "q8_0"), ("1x2 int8-ch bf16 act", "q8_0"),
              ("tp2 int8-ch bf16 act", "q8_0"), ("1x2 int8-ch int8 act", "q8_0"),
              ("tp2 int8-ch int8 act", "q8_0"), ("1x2 int8 int8 act", "q8_0"),
              ("tp2 int8 int8 act", "q8_0")]
for P in sorted({r["prompt"] for r in rows}):
    for sc, lcfg in pairs:
        key = lambda r: (r["prompt"], r["side"], r["config"])
        s = {r["round"]: r for r in rows if key(r) == (P, "seqpar", sc)}
        l = {r["round"]: r for r in rows if key(r) == (P, "llama.cpp", lcfg)}
        both = sorted(set(s) & set(l))
        if not both:
            continue
        pr = [l[k]["prefill_s"] / s[k]["prefill_s"] for k in both]
        dr = [l[k]["decode_s_per_token"] / s[k]["decode_s_per_token"] for k in both]
        def rate(side, f):
            return med([f(side[k]) for k in both])
        def ceiling_share(side, config):
            b = bytes_of(config)
            if b is None or not all(k in read for k in both):
                return "-"
            return f"{med([b / side[k]['decode_s_per_token'] / 1e9 / read[k] for k in both]):.2f}"
        print(f"| {P} | {sc} | {lcfg} "
              f"| {rate(s, lambda r: P / r['prefill_s']):.1f} / "
              f"{rate(l, lambda r: P / r['prefill_s']):.1f} "
              f"| {min(pr):.2f} / {med(pr):.2f} "
              f"| {rate(s, lambda r: 1 / r['decode_s_per_token']):.2f} / "
              f"{rate(l, lambda r: 1 / r['decode_s_per_token']):.2f} "
              f"| {min(dr):.2f} / {med(dr):.2f} "
              f"| {ceiling_share(s, sc)} / {ceiling_share(l, lcfg)} "
              f"| {max(s[k]['rss_bytes'] for k in both) / 1e9:.2f} / "
              f"{max(l[k]['rss_bytes'] for k in both) / 1e9:.2f} |")
if read:
    rates = sorted(read.values())
    print(f"\nStreaming read on {threads} threads (bench/read_bench, 1 GiB, before each round and "
          f"after the last): {rates[0]:.1f} / {med(rates):.1f} / {rates[-1]:.1f} GB/s (min / "
          "median / max). The read ceiling of a decoded token: read rate / weight bytes "
          + ", ".join(f"({w.upper()} GGUF {b / 1e9:.2f} GB: {med(rates) * 1e9 / b:.1f} tokens/s at "
                      "the median)" for w, b in weight_bytes.items()) + ".")
if int8 != "1":
    print("\nseqpar int8 vs llama.cpp Q8_0: skipped (--weights without int8, or `seqpar "
          "generate --help` has no --weights-dtype).")
if os.path.exists(check):
    c = json.load(open(check))
    print(f"\nCorrectness (16-token prompt, {c['tokens']} greedy tokens; seqpar 1 rank on bf16 "
          f"weights, llama.cpp on the F32 GGUF, F32 K/V): tokens agree {c['tokens_agree']}/"
          f"{c['tokens']} (first {c['agree_prefix']} in a row); max |logit diff| "
          f"{c['max_abs_logit_diff_first']:.3g} at the prompt's last position (logits up to "
          f"{c['max_abs_logit_first']:.3g}, top-2 margin {c['argmax_margin_first']:.3g}), "
          f"{c['max_abs_logit_diff_prefix']:.3g} over the agreeing prefix. llama.cpp's flash "
          "attention off here; with it (its default, used in the timings) the max |logit diff| "
          "at the prompt's last position is "
          f"{json.load(open(check_fa))['max_abs_logit_diff_first']:.3g}.")
EOF
cat "$report"
# --out: a copy beside it, renamed over it once written.
[[ -z "$out" ]] || { cp "$report" "$out.part.$$" && mv -f "$out.part.$$" "$out"; }
echo "compare_llamacpp: raw results in $results" >&2
