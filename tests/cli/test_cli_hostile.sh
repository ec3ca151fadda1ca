#!/usr/bin/env bash
# Hostile command lines (issue 10): each is refused or fails cleanly, fast, with the expected exit
# code and one line on stderr naming the problem. A per-command timeout makes a hang a failure.
#   exit 2: the argument is out of range or the job cannot fit (nothing ran);
#   exit 1: an output cannot be opened (before the work) or written (the work ran).
# usage: test_cli_hostile.sh path/to/seqpar [path/to/mpiexec]
set -u
bin=${1:?usage: test_cli_hostile.sh path/to/seqpar [mpiexec]}
mpiexec=${2:-}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
limit=${SEQPAR_HOSTILE_TIMEOUT:-30}  # seconds per command
small="--seq 64 --heads 2 --head-dim 8 --repeat 1"

# expect <code> <stdout: file or -> <text the one stderr line holds> <seqpar args...>
expect() {
  local code=$1 out=$2 text=$3; shift 3
  local err rc
  if [ "$out" = "-" ]; then out=/dev/null; fi
  err=$(timeout "$limit" "$bin" "$@" 2>&1 >"$out"); rc=$?
  if [ $rc -eq 124 ]; then bad "$*: still running after ${limit}s"; return; fi
  [ $rc -eq "$code" ] && ok || bad "$* exited $rc, want $code: $err"
  [ "$(printf '%s\n' "$err" | grep -c .)" -eq 1 ] && ok || bad "$*: stderr is not one line: $err"
  printf '%s' "$err" | grep -q -- "$text" && ok || bad "$*: stderr does not say '$text': $err"
}

# 1. Integer overflow and traps: every size against a stated maximum, no wrapping, no saturation.
while IFS='|' read -r code text args; do
  [ -z "$code" ] && continue
  # shellcheck disable=SC2086
  expect "$code" - "$text" $args
done <<'TABLE'
2|--ranks 2147483647 is out of range|mesh --heads 8 --seq 64 --ranks 2147483647
2|--ranks -1000000 is out of range|mesh --heads 8 --seq 64 --ranks -1000000
2|9223372036854775808 is out of range|mesh --heads 8 --seq 9223372036854775808
2|-9223372036854775809 is out of range|run --seq -9223372036854775809
2|--seq 9223372036854775807 is out of range|mesh --heads 8 --seq 9223372036854775807
2|--heads 9223372036854775807 is out of range|mesh --heads 9223372036854775807 --seq 64 --tp 3
2|--tp 4294967297 is out of range|mesh --heads 8 --seq 64 --tp 4294967297
2|exceeds the maximum 65536|mesh --heads 8 --seq 64 --tp 2 --ring-degree 256 --ulysses-degree 256
2|exceeds the maximum 65536|mesh --heads 8 --seq 64 --cfg 65536 --tp 65536 --ring-degree 65536 --ulysses-degree 65536
2|--ranks 2147483647 is out of range|run --ranks 2147483647 --seq 64
2|--ranks -1000000 is out of range|run --ranks -1000000 --seq 64
2|--seq 9223372036854775807 is out of range|run --seq 9223372036854775807
2|--cached 9223372036854775807 is out of range|run --strategy passq --cached 9223372036854775807 --new 9223372036854775807
2|--head-dim 9223372036854775807 is out of range|plan --seq 1024 --heads 8 --head-dim 9223372036854775807
2|--batch 9223372036854775807 is out of range|plan --seq 1024 --heads 8 --batch 9223372036854775807
2|--cached 4611686018427387904 is out of range|plan --heads 8 --cached 4611686018427387904 --new 4611686018427387904
2|score elements|plan --seq 4294967296 --heads 65536 --ranks 8
2|--height 9223372036854775807 is out of range|plan --model wan2.1-t2v-14b --height 9223372036854775807 --width 432 --frames 33
2|--ranks 2147483647 is out of range|plan --seq 1024 --heads 8 --ranks 2147483647
2|--ring-degree 2147483648 is out of range|plan --seq 1024 --heads 8 --ring-degree 2147483648
2|--repeat 9223372036854775807 is out of range|run --repeat 9223372036854775807
2|--decode 9223372036854775807 is out of range|model --preset tiny-llm --decode 9223372036854775807
2|--steps -1 is out of range|model --preset tiny-dit --steps -1
TABLE

# 2. Work or memory sized by an absurd number: estimated first, refused naming need and limit.
while IFS='|' read -r code text args; do
  [ -z "$code" ] && continue
  # shellcheck disable=SC2086
  expect "$code" - "$text" $args
done <<'TABLE'
2|available (MemAvailable)|run --seq 1000000000
2|available (MemAvailable)|run --seq 4000000 --heads 64 --strategy allgather --ranks 64
2|available (MemAvailable)|model --preset llama3-70b
2|fp32, 100016 tokens, K/V cache bf16) needs about 395 GB of memory|model --preset llama3-70b --prompt-len 100000 --kv-cache-dtype bf16
2|fp32, 100016 tokens, K/V cache fp32) needs about 428 GB of memory|model --preset llama3-70b --prompt-len 100000
2|fp32, 100016 tokens, K/V cache bf16) needs about 428 GB of memory|model --preset llama3-70b --prompt-len 100000 --kv-cache-dtype bf16 --tp 16
2|not a regular file|run --hardware /dev/zero
2|not a regular file|plan --seq 1024 --heads 8 --hardware /dev/zero
2|not a regular file|run --strategy auto --cached 64 --new 4 --hardware /dev/stdin
2|run pairs|plan --seq 65536 --heads 8 --ranks 65536 --top 0
2|--sim-ranks '8:1000000000' is invalid|plan --seq 1024 --heads 8 --simulate --sim-ranks 8:1000000000
2|--top 9223372036854775807 is out of range|plan --seq 1024 --heads 8 --top 9223372036854775807
TABLE

# 3. Threads: --ranks and --threads bounded by what one process may start.
while IFS='|' read -r code text args; do
  [ -z "$code" ] && continue
  # shellcheck disable=SC2086
  expect "$code" - "$text" $args
done <<'TABLE'
2|threads in one process exceeds the maximum|run --ranks 65536 --seq 65536 --heads 1 --head-dim 1
2|--ranks 100 x --threads 100 = 10000 threads in one process exceeds the maximum|run --ranks 100 --threads 100 --seq 1000
2|--threads 100000 is out of range|run --threads 100000
TABLE

# 4. Outputs checked before the work, written whole or not at all (core/files.h); every write,
# flush and close checked; an output that is an input of the run refused before it runs.
expect 1 - "the folder '$tmp/no/such/dir' does not exist" run $small --trace "$tmp/no/such/dir/t.json"
expect 1 - "--trace '/dev/full': cannot write" run $small --trace /dev/full
out=$(timeout "$limit" "$bin" run $small --json --trace /dev/full 2>/dev/null)
[ "$(json_get "$out" ok)" = "True" ] && ok || bad "--trace /dev/full lost the report: $out"
expect 1 /dev/full "cannot write the output to stdout" run $small --json
expect 1 /dev/full "cannot write the output to stdout" run $small
expect 1 /dev/full "cannot write the output to stdout" mesh --heads 8 --seq 64 --json
expect 1 /dev/full "cannot write the output to stdout" plan --seq 1024 --heads 8 --json
expect 1 /dev/full "cannot write the output to stdout" info --json
expect 1 - "--svg '/dev/full': cannot write" plan --seq 1024 --heads 8 --simulate --svg /dev/full
expect 1 - "the folder '$tmp/no' does not exist" plan --seq 1024 --heads 8 --simulate --svg "$tmp/no/x.svg"
expect 1 - "--out '/dev/full': cannot write" calibrate --quick --out /dev/full
expect 1 - "the folder '$tmp/no' does not exist" calibrate --quick --out "$tmp/no/x.json"
[ ! -e "$tmp/no" ] && ok || bad "calibrate --out made the folder $tmp/no"
expect 2 - "--out: '' is empty; give a value or leave the flag out" calibrate --quick --out ''
expect 1 - "the folder '$tmp/no' does not exist" model --preset tiny-llm --save-weights "$tmp/no/w.safetensors"
expect 1 - "--save-weights '/dev/full': cannot write the file" model --preset tiny-llm --save-weights /dev/full --decode 1
"$bin" model --preset tiny-llm --decode 1 --prompt-len 8 --save-weights "$tmp/w.safetensors" >/dev/null 2>&1
before=$(sha256sum <"$tmp/w.safetensors")
expect 2 - "--save-weights '$tmp/w.safetensors' is the input '$tmp/w.safetensors' of this run" \
  model --preset tiny-llm --decode 1 --prompt-len 8 --weights "$tmp/w.safetensors" --save-weights "$tmp/w.safetensors"
[ "$(sha256sum <"$tmp/w.safetensors")" = "$before" ] && ok || bad "--save-weights changed its input"
cp "$(dirname "${BASH_SOURCE[0]}")/../../profiles/h100.json" "$tmp/h.json"
profile_before=$(sha256sum <"$tmp/h.json")
expect 2 - "--trace '$tmp/h.json' is the input" run $small --hardware "$tmp/h.json" --trace "$tmp/h.json"
expect 2 - "--svg '$tmp/h.json' is the input" plan --seq 1024 --heads 8 --hardware "$tmp/h.json" --simulate --svg "$tmp/h.json"
[ "$(sha256sum <"$tmp/h.json")" = "$profile_before" ] && ok || bad "an input profile changed"
mkfifo "$tmp/fifo"
expect 2 - "is a FIFO, not a regular file" model --preset tiny-llm --weights "$tmp/fifo"
expect 2 - "is not a regular file" run $small --strategy auto --cached 64 --new 4 --hardware "$tmp/fifo"
expect 2 - "is a FIFO, not a regular file" model --preset tiny-llm --parallel-config "$tmp/fifo"
expect 2 - "is a FIFO, not a regular file" generate --model "$tmp" --prompt-ids-file "$tmp/fifo"
# A FIFO (or a folder) where a model directory has its config.json or weights is refused as not a
# regular file, without blocking; it used to read as missing.
mkdir -p "$tmp/fifo_config" "$tmp/fifo_weights" "$tmp/dir_config/config.json"
mkfifo "$tmp/fifo_config/config.json" "$tmp/fifo_weights/model.safetensors"
printf '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 16, "max_position_embeddings": 12, "rms_norm_eps": 1e-5}' \
  >"$tmp/fifo_weights/config.json"
expect 2 - "$tmp/fifo_config/config.json is a FIFO, not a regular file" \
  generate --model "$tmp/fifo_config" --prompt-ids 1
expect 2 - "$tmp/fifo_weights/model.safetensors is a FIFO, not a regular file" \
  generate --model "$tmp/fifo_weights" --prompt-ids 1
expect 2 - "$tmp/dir_config/config.json is a directory, not a regular file" \
  generate --model "$tmp/dir_config" --prompt-ids 1

# Under MPI --save-weights is written by rank 0 before the run, as on threads: the same bytes; a
# folder that does not exist or an input refused in one line with the threads' exit code, promptly
# (rank 1 used to go on alone, and the flag was ignored).
if [ -n "$mpiexec" ]; then
  mpi_model() {  # mpi_model <seqpar model args...>: 2 ranks, stderr's seqpar lines; sets rc
    err=$(SEQPAR_TIMEOUT_S=30 timeout -s KILL 90 "$mpiexec" --allow-run-as-root --oversubscribe \
            --mca btl_vader_single_copy_mechanism none -x SEQPAR_TIMEOUT_S -n 2 \
            "$bin" model --preset tiny-llm --decode 1 --prompt-len 8 --tp 2 --backend mpi "$@" \
            2>&1 >/dev/null </dev/null); rc=$?
    err=$(printf '%s\n' "$err" | grep seqpar)
  }
  mpi_model --save-weights "$tmp/mpi_w.safetensors"
  [ $rc -eq 0 ] && cmp -s "$tmp/mpi_w.safetensors" "$tmp/w.safetensors" && ok ||
    bad "mpi --save-weights: exit $rc, not the threads' file: $err"
  mpi_model --save-weights "$tmp/no/w.safetensors"
  [ $rc -eq 1 ] && [ "$(printf '%s\n' "$err" | grep -c .)" -eq 1 ] &&
    printf '%s' "$err" | grep -q "seqpar: error: --save-weights '$tmp/no/w.safetensors': the folder '$tmp/no' does not exist" &&
    ok || bad "mpi --save-weights in a missing folder: exit $rc: $err"
  mpi_model --weights "$tmp/w.safetensors" --save-weights "$tmp/w.safetensors"
  [ $rc -eq 2 ] && [ "$(printf '%s\n' "$err" | grep -c .)" -eq 1 ] &&
    printf '%s' "$err" | grep -q "seqpar: error: --save-weights '$tmp/w.safetensors' is the input" &&
    [ "$(sha256sum <"$tmp/w.safetensors")" = "$before" ] &&
    ok || bad "mpi --save-weights over its input: exit $rc: $err"
  mpi_model --save-weights /dev/full
  [ $rc -eq 1 ] && [ "$err" = "seqpar: error: --save-weights '/dev/full': cannot write the file (No space left on device)" ] &&
    ok || bad "mpi --save-weights /dev/full: exit $rc: $err"
fi

# 5. Messages: what was wrong, with the valid values.
while IFS='|' read -r code text args; do
  [ -z "$code" ] && continue
  # shellcheck disable=SC2086
  expect "$code" - "$text" $args
done <<'TABLE'
2|--timeout 0.0001 is out of range; valid: 0.001 to 604800|run --timeout 0.0001
2|--timeout inf is out of range|run --timeout inf
2|--timeout nan is out of range|run --timeout nan
2|valid: ring, allgather, ulysses, usp, passq, passkv, auto|run --strategy bogus
2|--hardware|run --hardware bogus
2|--guidance nan is out of range|model --preset tiny-dit --guidance nan
2|--memory-limit nan is invalid|plan --seq 1024 --heads 8 --memory-limit nan
TABLE
expect 2 - "--weights: '' is empty" model --preset tiny-llm --weights ''
for v in inf nan 0 -1 abc 1e12; do
  SEQPAR_TIMEOUT_S=$v expect 2 - "SEQPAR_TIMEOUT_S='$v' is not valid: expected seconds from 0.001" run $small
done

# 6. With --json an error is also one JSON object on stdout.
for args in "run --strategy bogus --json" "mesh --heads 8 --seq 64 --ranks 3 --json" \
    "plan --seq 1024 --heads 8 --ranks 0 --json" "model --preset tiny-dit --guidance nan --json" \
    "run --seq abc --json" "run --json --seq 9223372036854775808" "mesh --bogus-flag --json"; do
  # shellcheck disable=SC2086
  out=$(timeout "$limit" "$bin" $args 2>/dev/null); rc=$?
  [ $rc -eq 2 ] && ok || bad "$args exited $rc, want 2"
  [ "$(json_get "$out" exit_code 2>/dev/null)" = "2" ] && ok || bad "$args: no JSON error object: $out"
  [ -n "$(json_get "$out" error 2>/dev/null)" ] && ok || bad "$args: JSON error has no message: $out"
done
out=$(timeout "$limit" "$bin" run $small --json --trace /dev/full 2>/dev/null)
[ "$(printf '%s\n' "$out" | grep -c .)" -eq 1 ] && ok || bad "run --json printed more than one object: $out"

# 7. MPI: a rank stopped outside communication is named by the rank whose collective times out
# (it used to read as that healthy rank's own timeout). Rank 1 is stopped (SIGSTOP) mid-run.
if [ -n "$mpiexec" ]; then
  SEQPAR_PROGRESS=1 timeout -s KILL 90 "$mpiexec" --allow-run-as-root --oversubscribe \
    --mca btl_vader_single_copy_mechanism none -np 2 \
    "$bin" run --backend mpi --strategy allgather --seq 2048 --heads 2 --head-dim 16 \
    --repeat 1000000 --warmup 0 --timeout 2 >"$tmp/mpi.out" 2>"$tmp/mpi.err" &
  launcher=$!
  victim=$(mpi_rank_pid $launcher 1)
  # Stop it once both ranks are past MPI_Init and inside the collectives (a rank stopped during
  # MPI_Init hangs its peer in Open MPI, before any seqpar timeout): rank 0's first progress line
  # comes after calls whose all-gathers rank 1 took part in.
  if [ -n "$victim" ] && wait_for_line "$tmp/mpi.err" "^seqpar run: [0-9]+/" $launcher; then
    kill -STOP "$victim"
    wait_for_line "$tmp/mpi.err" "timeout after" $launcher
    kill -CONT "$victim"
  fi
  wait "$launcher"; rc=$?
  [ -n "$victim" ] && ok || bad "mpi stall: rank 1 not found"
  [ $rc -ne 0 ] && ok || bad "mpi stall: exited 0"
  grep -q "rank 0 waiting for .*which world rank 1 did not reach" "$tmp/mpi.err" && ok \
    || bad "mpi stall: the timeout does not name rank 1: $(grep seqpar "$tmp/mpi.err")"
fi

echo "test_cli_hostile: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
