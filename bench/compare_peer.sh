#!/usr/bin/env bash
# seqpar side by side with the PyTorch + gloo peer (../shared/peer/torch_cp_peer.py), in one run,
# interleaved: 2 ranks, S in {4096, 16384}, H = 8, D = 128, causal off and on, ring and allgather.
# Also measures, in the same run (before and after), the one-thread fp32 GEMM rate of this machine
# (bench/gemm_bench: one GEMM alone, and two at once on two threads), the reference for "ring on 2
# ranks reaches 0.8 of two one-thread GEMM rates".
#
#   bench/compare_peer.sh [--build DIR] [--seqs "4096 16384"] [--reps 2] [--rounds 2]
#                         [--peer PATH] [--peer-python PY] [--backend threads|mpi] [--out FILE]
#
# Prints a markdown table (also written to --out if given). Both sides: 2 ranks, 1 thread per rank,
# the same shapes, contiguous shards (seqpar's zigzag layout adds one row for causal ring), median
# of --reps timed runs after one warm-up; the best of --rounds interleaved rounds (the peer, which
# takes minutes at S = 16384, runs one round there). "exposed comm" is seqpar's
# exposed_comm_fraction (worst rank), the lowest over the rounds.
# GFLOP/s count 4·D flops per visible score element on both sides (causal: half the square).
#
# The peer runs on the PyTorch of the references' environment (BUILD/pyenv, made by make test;
# PyTorch 2.8: the peer then uses PyTorch's CPU flash-attention kernel for every block), or on
# --peer-python PY. Without that environment it needs Debian's python3-torch (PyTorch 1.13: plain
# matmuls, a much weaker peer; installed here with apt-get if missing; only this benchmark needs
# it, so it is not in scripts/install-deps.sh). python3-torch calls whatever
# libblas.so.3 Debian has selected; if that is the reference BLAS (about 20x slower than OpenBLAS
# here) the script installs libopenblas0-pthread, which is what a user of python3-torch gets as
# soon as any package pulls OpenBLAS in. OPENBLAS_CORETYPE=SkylakeX is set for the peer only, and
# only on CPUs with AVX-512 (Debian's OpenBLAS misdetects those Xeons; on others SkylakeX kernels
# would not run and OpenBLAS's own detection is used). Override with PEER_OPENBLAS_CORETYPE.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="$root/build"
seqs="4096 16384"
reps=2
rounds=2
peer="$root/../shared/peer/torch_cp_peer.py"
py=""
backend="threads"
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --seqs) seqs="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --peer) peer="$2"; shift 2 ;;
    --peer-python) py="$2"; shift 2 ;;
    --backend) backend="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "compare_peer.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

seqpar="$build/seqpar"
gemm="$build/bench/gemm_bench"
for exe in "$seqpar" "$gemm"; do
  [[ -x "$exe" ]] || { echo "compare_peer.sh: $exe not built (cmake --build $build --target seqpar gemm_bench)" >&2; exit 2; }
done
[[ -f "$peer" ]] || { echo "compare_peer.sh: peer script $peer not found (--peer PATH)" >&2; exit 2; }

as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }
if [[ -z "$py" && -x "$build/pyenv/bin/python" ]] && "$build/pyenv/bin/python" -c "import torch" 2>/dev/null; then
  py="$build/pyenv/bin/python"
fi
debian_torch=0
if [[ -z "$py" || "$py" == /usr/bin/python3 ]]; then
  debian_torch=1
  py=/usr/bin/python3
  if ! "$py" -c "import torch" 2>/dev/null; then
    echo "installing python3-torch (Debian) for the peer ..." >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-torch >&2
  fi
fi
blas="$("$py" -c 'import torch; print(torch.__config__.show().split("BLAS_INFO=")[1].split(",")[0])' 2>/dev/null || echo "?")"
if [[ "$debian_torch" == 1 ]]; then
  blas="$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || true)"
  if [[ "$blas" != *openblas* && "$blas" != *blis* ]]; then
    echo "libblas.so.3 is the reference BLAS ($blas); installing libopenblas0-pthread ..." >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y libopenblas0-pthread >&2
    blas="$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || true)"
  fi
fi
if [[ "$debian_torch" == 0 ]]; then
  coretype=""  # PyTorch's own BLAS (oneMKL in the PyPI wheel), not Debian's OpenBLAS
elif [[ -n "${PEER_OPENBLAS_CORETYPE+x}" ]]; then
  coretype="$PEER_OPENBLAS_CORETYPE"
elif grep -qw avx512f /proc/cpuinfo; then
  coretype="SkylakeX"
else
  coretype=""
fi

mpirun_cmd=()
if [[ "$backend" == "mpi" ]]; then
  mpirun_cmd=(mpirun -np 2 --oversubscribe)
  [[ $(id -u) -eq 0 ]] && mpirun_cmd+=(--allow-run-as-root)
fi

# JSON field of the last line of a command's output.
field() { "$py" -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]])" "$1"; }
best() {  # the largest number among the arguments (words that are not numbers are ignored)
  "$py" -c "
import sys
v = []
for x in sys.argv[1:]:
    try: v.append(float(x))
    except ValueError: pass
print(max(v) if v else 'fail')" "$@"
}

gemm_rates() {  # prints "one_thread together"
  local j
  j="$("$gemm" --threads 2 --rounds 3 --min-time 0.5 --json)"
  echo "$(field one_thread_gflops <<<"$j") $(field together_gflops <<<"$j")"
}

run_seqpar() {  # strategy seq causal layout -> gflops (and the exposed fraction on stderr log)
  local strategy=$1 seq=$2 causal=$3 layout=$4 args j
  args=(run --strategy "$strategy" --layout "$layout" --seq "$seq" --heads 8 --head-dim 128
        --threads 1 --repeat "$reps" --json)
  [[ "$causal" == 1 ]] && args+=(--causal)
  if [[ "$backend" == "mpi" ]]; then
    j="$("${mpirun_cmd[@]}" "$seqpar" "${args[@]}" --backend mpi)"
  else
    j="$("$seqpar" "${args[@]}" --ranks 2)"
  fi
  echo "$(field gflops <<<"$j") $(field exposed_comm_fraction <<<"$j")"
}

# Peak bytes one peer rank holds for the score matrices: with plain matmuls (PyTorch < 2.2, and
# causal allgather, whose offset mask the flash kernel does not take) about 3 copies of
# (H, S/2, keys) fp32; PyTorch's CPU flash-attention kernel holds none (its blocks).
peer_flash="$("$py" -c 'import torch; print(int(hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")))' 2>/dev/null || echo 0)"
peer_bytes() {
  local strategy=$1 seq=$2 causal=$3 keys
  if [[ "$peer_flash" == 1 && ( "$strategy" == ring || "$causal" == 0 ) ]]; then echo 0; return; fi
  if [[ "$strategy" == allgather ]]; then keys=$seq; else keys=$((seq / 2)); fi
  echo $((3 * 8 * (seq / 2) * keys * 4))
}

run_peer() {  # strategy seq causal -> gflops, or "skip"
  local strategy=$1 seq=$2 causal=$3 need avail args
  need=$((2 * $(peer_bytes "$strategy" "$seq" "$causal")))
  avail=$(($(awk '/MemAvailable/ {print $2}' /proc/meminfo) * 1024))
  if (( need > avail * 8 / 10 )); then
    echo "skip:$((need >> 30))"
    return
  fi
  args=("$peer" --ranks 2 --seq "$seq" --heads 8 --head-dim 128 --strategy "$strategy"
        --reps "$reps" --threads 1 --no-check --port $((29500 + RANDOM % 400)))
  [[ "$causal" == 1 ]] && args+=(--causal)
  local j
  if [[ -n "$coretype" ]]; then
    j="$(OPENBLAS_CORETYPE="$coretype" OMP_NUM_THREADS=1 "$py" "${args[@]}")" || { echo fail; return; }
  else
    j="$(OMP_NUM_THREADS=1 "$py" "${args[@]}")" || { echo fail; return; }
  fi
  field gflops <<<"$j"
}

{
  echo "# seqpar vs PyTorch + gloo peer ($(date -u '+%Y-%m-%d %H:%M UTC'))"
  echo
  echo "- machine: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1), $(nproc) cores; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "- seqpar: $backend backend, 2 ranks x 1 thread; peer: $("$py" -c 'import torch; print("torch", torch.__version__)'), gloo, 2 processes x 1 thread, BLAS ${blas##*/} ($blas), OPENBLAS_CORETYPE=${coretype:-<auto>}"
  echo "- median of $reps timed runs after one warm-up each; best of $rounds interleaved rounds (the peer: one round for S > 4096)"
} | tee ${out:+"$out"}

read -r g1_one g1_two <<<"$(gemm_rates)"

declare -A sp ex pr
configs=()
for seq in $seqs; do
  for causal in 0 1; do
    for strategy in ring allgather; do configs+=("$strategy $seq $causal contiguous"); done
    [[ "$causal" == 1 ]] && configs+=("ring $seq 1 zigzag")
  done
done
for cfg in "${configs[@]}"; do
  read -r strategy seq causal layout <<<"$cfg"
  # seqpar: --rounds rounds at every size; the peer (slow): every round for S <= 4096, once above.
  s_vals=() e_vals=() p_vals=()
  for ((round = 0; round < rounds; ++round)); do
    read -r g e <<<"$(run_seqpar "$strategy" "$seq" "$causal" "$layout")"
    s_vals+=("$g"); e_vals+=("$e")
    last="n/a"
    if [[ "$layout" == contiguous ]] && (( seq <= 4096 || round == 0 )); then
      last="$(run_peer "$strategy" "$seq" "$causal")"
      p_vals+=("$last")
    fi
    echo "  $cfg round $((round + 1)): seqpar $g GFLOP/s, peer $last" >&2
  done
  sp[$cfg]="$(best "${s_vals[@]}")"
  ex[$cfg]="$("$py" -c "import sys; print(min(float(x) for x in sys.argv[1:]))" "${e_vals[@]}")"
  if [[ "$layout" == contiguous ]]; then
    if [[ "${p_vals[0]}" == skip:* ]]; then pr[$cfg]="${p_vals[0]}"; else pr[$cfg]="$(best "${p_vals[@]}")"; fi
  else
    pr[$cfg]="-"
  fi
done

read -r g2_one g2_two <<<"$(gemm_rates)"
one="$(best "$g1_one" "$g2_one")"
two="$(best "$g1_two" "$g2_two")"
ref="$("$py" -c "print(max(2 * $one, $two))")"

{
  echo
  echo "One-thread GEMM 1024^3 (oneDNN fp32): alone $g1_one / $g2_one GFLOP/s (start / end), two at once on two threads $g1_two / $g2_two GFLOP/s in total."
  echo "Reference \"two one-thread GEMM rates\" = max(2 x best alone, best two at once) = $ref GFLOP/s."
  echo
  echo "| strategy | layout | S | causal | seqpar GFLOP/s | peer GFLOP/s | seqpar / peer | seqpar / two 1-thread GEMMs | exposed comm |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for cfg in "${configs[@]}"; do
    read -r strategy seq causal layout <<<"$cfg"
    s="${sp[$cfg]}" p="${pr[$cfg]}"
    if [[ "$p" == skip:* ]]; then
      ratio="-"; p="skipped (needs ~${p#skip:} GiB)"
    elif [[ "$p" == fail ]]; then
      ratio="-"; p="failed"
    elif [[ "$p" == "-" ]]; then
      ratio="-"
    else
      ratio="$("$py" -c "print(f'{$s / $p:.1f}x')")"
      p="$("$py" -c "print(f'{$p:.1f}')")"
    fi
    gem="$("$py" -c "print(f'{$s / $ref:.2f}')")"
    printf '| %s | %s | %s | %s | %.1f | %s | %s | %s | %.3f |\n' "$strategy" "$layout" "$seq" \
      "$([[ $causal == 1 ]] && echo yes || echo no)" "$s" "$p" "$ratio" "$gem" "${ex[$cfg]}"
  done
  echo
  echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee ${out:+-a "$out"}
