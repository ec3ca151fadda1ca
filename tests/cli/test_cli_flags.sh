#!/usr/bin/env bash
# Documented flags, each by an observable effect, on both backends where it applies: --seed,
# --threads, --timeout, --guidance, plan --top, plan --ranks-per-node, plan --no-guidance, joint
# text with const-max and with --pad; and --verify's check of the lse error and the measured K/V
# bytes beside the predicted ones.
# usage: test_cli_flags.sh path/to/seqpar [path/to/mpiexec]
set -u
bin=${1:?usage: test_cli_flags.sh path/to/seqpar [mpiexec]}
mpiexec=${2:-}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
mpirun_n() { "$mpiexec" --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none -n "$@"; }
py() { python3 -c "$@"; }  # py '<program reading sys.argv>' args...
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Runs seqpar on the backend ($1: threads or mpi; mpi runs 2 ranks), printing its JSON.
on() {
  local backend=$1; shift
  if [ "$backend" = mpi ]; then mpirun_n 2 "$bin" "$@" --backend mpi --json
  else "$bin" "$@" --ranks 2 --json; fi
}
backends=threads
[ -n "$mpiexec" ] && backends="threads mpi"
small="run --strategy ring --seq 96 --heads 2 --head-dim 16 --causal --verify --repeat 1"

for be in $backends; do
  # --seed: the inputs (and so the errors against the reference) follow the seed.
  a=$(on $be $small --seed 1); b=$(on $be $small --seed 1); c=$(on $be $small --seed 2)
  [ "$(json_get "$a" max_abs_err)" = "$(json_get "$b" max_abs_err)" ] && ok || bad "$be: --seed 1 twice gave different results"
  [ "$(json_get "$a" max_abs_err)" != "$(json_get "$c" max_abs_err)" ] && ok || bad "$be: --seed 1 and 2 gave the same result"
  # --verify: ok checks the lse error too, and the JSON holds it beside its bound.
  py 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if d["ok"] and 0 <= d["max_lse_err"] <= d["lse_tolerance"] and 0 <= d["max_abs_err"] <= d["tolerance"] else 1)' "$a" && ok || bad "$be: lse error/bound missing: $a"
  # --threads: the threads per rank the run used.
  out=$(on $be $small --threads 1)
  [ "$(json_get "$out" threads)" = 1 ] && ok || bad "$be: --threads 1 shows $(json_get "$out" threads)"
  # joint text attention with const-max and with --pad, verified.
  expect_ok "$be joint const-max" on $be run --strategy ring --softmax const-max --seq 101 --text-tokens 7 --heads 4 --head-dim 16 --verify --repeat 1
  expect_ok "$be joint pad" on $be run --strategy ring --pad --layout zigzag --seq 101 --text-tokens 7 --heads 4 --head-dim 16 --verify --repeat 1
  expect_ok "$be joint usp const-max pad" on $be run --strategy usp --softmax const-max --pad --seq 101 --text-tokens 5 --heads 4 --head-dim 16 --verify --repeat 1
  # fp16 inputs through the CLI, at the fp16 path's bound.
  expect_ok "$be fp16 ulysses" on $be run --strategy ulysses --seq 97 --heads 4 --head-dim 32 --dtype fp16 --causal --verify --repeat 1
done

# --timeout: the deadline the run used.
out=$("$bin" $small --ranks 2 --timeout 7 --json)
[ "$(json_get "$out" timeout_s)" = 7.0 ] && ok || bad "--timeout 7 shows $(json_get "$out" timeout_s)"

# --threads on the threads backend: any count per rank.
out=$("$bin" $small --ranks 2 --threads 2 --json)
[ "$(json_get "$out" threads)" = 2 ] && ok || bad "--threads 2 shows $(json_get "$out" threads)"

# --timeout: the deadline of every wait. A run whose peer stops would wait for ever without it;
# with --timeout 2 the waiting rank fails within seconds, naming the timeout, also when the peer
# stops in the middle of a ring block's transfer (a receive MPI has already matched cannot be
# cancelled: MpiRequest::cancel polls it for a bounded time, then releases it).
expect_exit2 "--timeout" run --ranks 2 --seq 64 --heads 2 --timeout -1
if [ -n "$mpiexec" ]; then
  "$mpiexec" --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none -n 2 \
    "$bin" run --backend mpi --strategy ring --seq 2048 --heads 2 --head-dim 64 --repeat 100000 \
    --timeout 2 --json >"$tmp/stall.out" 2>"$tmp/stall.err" &
  launcher=$!
  rank0=; rank1=
  for _ in $(seq 600); do  # the launcher's children, by their MPI rank (start-up is slow under load)
    for p in $(pgrep -P $launcher); do
      envf=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null)
      printf '%s\n' "$envf" | grep -qx OMPI_COMM_WORLD_RANK=0 && rank0=$p
      printf '%s\n' "$envf" | grep -qx OMPI_COMM_WORLD_RANK=1 && rank1=$p
    done
    [ -n "$rank0" ] && [ -n "$rank1" ] && break
    sleep 0.1
  done
  if [ -z "$rank0" ] || [ -z "$rank1" ]; then
    bad "--timeout: could not find the two ranks of the launcher within 60 s"
    kill $launcher 2>/dev/null
    wait $launcher
  else
    # Past MPI's start-up (which no deadline covers): rank 1 has computed for 3 s of CPU time.
    cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
    for _ in $(seq 600); do [ "$(cpu_ticks "$rank1")" -ge $((3 * $(getconf CLK_TCK))) ] && break; sleep 0.1; done
    kill -STOP "$rank1"
    alive() { [ -e "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
    # Rank 0 ends by its own deadline and says so (below); a hang shows as the ctest timeout.
    while alive "$rank0"; do sleep 0.1; done
    kill -KILL "$rank1" 2>/dev/null
    kill -CONT "$rank1" 2>/dev/null
    wait $launcher; rc=$?
    [ $rc -ne 0 ] && ok || bad "--timeout: a stalled run exited 0"
    grep -qi "time" "$tmp/stall.err" && ok || bad "--timeout: the error does not name the timeout: $(head -3 "$tmp/stall.err")"
  fi
fi

# denoise under MPI: a rank stopped (SIGSTOP) between the steps of a long loop is named by the
# rank that waits for it, in the sequence-parallel exchange and in the guidance branches' gather,
# within the deadline (SEQPAR_TIMEOUT_S=2); nothing is written. Where rank 0 waits depends on
# where rank 1 stopped: a ring step's receive from or send to rank 1 (a send larger than MPI's
# eager limit waits for the receiver), or a collective rank 1 did not reach. The tiny Wan
# checkpoint is test_cli_denoise.sh's (its write.py).
if [ -n "$mpiexec" ]; then
  sed -n "/^cat > \"\$tmp\/write.py\" <<'EOF'\$/,/^EOF\$/p" \
    "$(dirname "${BASH_SOURCE[0]}")/test_cli_denoise.sh" | sed '1d;$d' >"$tmp/write.py"
  mkdir "$tmp/wan_ckpt"
  if ! python3 "$tmp/write.py" "$tmp/wan_ckpt" >/dev/null 2>&1; then
    bad "denoise stall: no checkpoint from test_cli_denoise.sh's write.py"
  else
    for mesh in "--ring-degree 2" "--cfg 2"; do
      SEQPAR_TIMEOUT_S=2 timeout -s KILL 90 "$mpiexec" --allow-run-as-root --oversubscribe \
        --mca btl_vader_single_copy_mechanism none -x SEQPAR_TIMEOUT_S -n 2 \
        "$bin" denoise --model "$tmp/wan_ckpt/wan" --inputs "$tmp/wan_ckpt/in.safetensors" \
        --steps 1000000 --output "$tmp/stalled.safetensors" --json --backend mpi $mesh \
        >/dev/null 2>"$tmp/stall.err" </dev/null &
      launcher=$!
      victim=$(mpi_rank_pid $launcher 1)
      # Rank 0 reports a step once every rank has ended it: past MPI_Init and the load.
      wait_for_line "$tmp/stall.err" "^seqpar denoise: step 1/" $launcher ||
        bad "denoise mpi $mesh: no step reported: $(head -3 "$tmp/stall.err")"
      [ -n "$victim" ] && kill -STOP "$victim"
      wait $launcher; rc=$?
      [ -n "$victim" ] && { kill -CONT "$victim"; kill -KILL "$victim"; } 2>/dev/null
      [ $rc -ne 0 ] && [ ! -e "$tmp/stalled.safetensors" ] &&
        grep -qE "seqpar: error: rank 0: timeout after 2 s: .*(which world rank 1 did not reach|waiting for (recv from|send to) rank 1 )" "$tmp/stall.err" &&
        ok || bad "denoise mpi $mesh: a stopped rank is not named: exit $rc: $(grep "seqpar: error" "$tmp/stall.err")"
    done
  fi
fi

# --guidance (dit, two guidance branches): the scale changes the output (its fingerprint
# output_rms); the same scale gives the same run.
dit="model --preset tiny-dit --cfg 2 --verify --json"
a=$("$bin" $dit --guidance 1); b=$("$bin" $dit --guidance 1); c=$("$bin" $dit --guidance 6)
[ "$(json_get "$a" ok)" = True ] && [ "$(json_get "$c" ok)" = True ] && ok || bad "--guidance runs not ok: $a $c"
[ "$(json_get "$a" output_rms)" = "$(json_get "$b" output_rms)" ] && ok || bad "--guidance 1 twice differ"
[ "$(json_get "$a" output_rms)" != "$(json_get "$c" output_rms)" ] && ok || bad "--guidance 1 and 6 gave the same output"
expect_exit2 "diffusion" model --preset tiny-llm --cfg 2 --prompt-len 16 --decode 1
expect_exit2 "--prefill-chunk is for llm presets" model --preset tiny-dit --prefill-chunk 4
# An llm preset's prompt in chunks over the cache: the same tokens as the whole prompt on one rank.
out=$("$bin" model --preset tiny-llm --ring-degree 2 --prompt-len 24 --decode 2 --prefill-chunk 8 \
      --chunk-strategy passq --verify --json 2>&1)
[ "$(json_get "$out" ok)" = True ] && [ "$(python3 -c 'import json,sys; print([c["strategy"] for c in json.loads(sys.argv[1])["prefill_chunks"]])' "$out")" = "['ring', 'passq', 'passq']" ] &&
  ok || bad "model --prefill-chunk: $out"

# The degree names of vLLM-Omni and xDiT: the long flags, sequence_parallel_size, and a
# --parallel-config file (YAML as a stage config nests it, or JSON) whose values flags override.
small_dit="model --preset tiny-dit --frames 1 --height 32 --width 32 --verify --json"
degrees() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["ok"], d["tp"], d["ulysses_degree"], d["ring_degree"], d["strategy"])' "$1"; }
out=$("$bin" $small_dit --tensor-parallel-size 2 --sequence-parallel-size 2)
[ "$(degrees "$out")" = "True 2 1 2 ring" ] && ok || bad "--tensor-parallel-size 2 --sequence-parallel-size 2: $out"
out=$("$bin" $small_dit --sequence-parallel-size 4 --ulysses-degree 2 --ulysses-mode advanced_uaa)
[ "$(degrees "$out")" = "True 1 2 2 usp" ] && ok || bad "--sequence-parallel-size 4 --ulysses-degree 2: $out"
cat > "$tmp/stage.yaml" <<'YAML'
stage_args:
  - stage_id: 0
    engine_args:
      parallel_config:
        ulysses_degree: 2   # heads split in two
        ring_degree: 2
        ulysses_mode: advanced_uaa
YAML
out=$("$bin" $small_dit --parallel-config "$tmp/stage.yaml")
[ "$(degrees "$out")" = "True 1 2 2 usp" ] && ok || bad "--parallel-config stage.yaml: $out"
out=$("$bin" $small_dit --parallel-config "$tmp/stage.yaml" --ring-degree 1)
[ "$(degrees "$out")" = "True 1 2 1 ulysses" ] && ok || bad "--parallel-config with --ring-degree 1: $out"
echo '{"tensor_parallel_size": 2, "cfg_parallel_size": 2}' > "$tmp/pc.json"
out=$("$bin" $small_dit --parallel-config "$tmp/pc.json")
[ "$(json_get "$out" cfg) $(json_get "$out" tp)" = "2 2" ] && ok || bad "--parallel-config pc.json: $out"
echo '{"parallel_config": {"ulysses_degree": 2, "pipeline_parallel_size": 2}}' > "$tmp/bad.json"
expect_exit2 "pipeline_parallel_size' is 2; seqpar runs no pipeline" model --preset tiny-dit --parallel-config "$tmp/bad.json"
# A file's keys are named as the file spells them, not as the flags.
printf 'ulysses_degree: two\n' > "$tmp/word.yaml"
expect_exit2 "error: --parallel-config $tmp/word.yaml: 'ulysses_degree' is 'two'; valid: an integer" model --preset tiny-dit --parallel-config "$tmp/word.yaml"
expect_exit2 "--sequence-parallel-size 4 must equal --ulysses-degree x --ring-degree = 2 x 3" model --preset tiny-dit --sequence-parallel-size 4 --ulysses-degree 2 --ring-degree 3
expect_exit2 "--parallel-config $tmp/none.yaml: cannot open the file" model --preset tiny-dit --parallel-config "$tmp/none.yaml"

# plan takes the long names of its cfg and tp pins.
out=$("$bin" plan --seq 4096 --heads 8 --ranks 4 --tensor-parallel-size 1 --cfg-parallel-size 1 --json)
python3 -c 'import json,sys; m=json.loads(sys.argv[1])["meshes"]; sys.exit(0 if m and all(x["tp"] == 1 and x["cfg"] == 1 for x in m) else 1)' "$out" && ok || bad "plan --tensor-parallel-size 1 --cfg-parallel-size 1: not pinned"
# plan --sequence-parallel-size pins ulysses x ring (any split), so tp x cfg takes the rest.
out=$("$bin" plan --model wan2.1-t2v-14b --height 240 --width 432 --frames 33 --ranks 8 --sequence-parallel-size 4 --json)
python3 -c 'import json,sys; m=json.loads(sys.argv[1])["meshes"]; sys.exit(0 if m and all(x["ulysses_degree"] * x["ring_degree"] == 4 for x in m) and len({x["ulysses_degree"] for x in m}) > 1 else 1)' "$out" && ok || bad "plan --sequence-parallel-size 4: $out"
expect_exit2 "--sequence-parallel-size 4 must equal --ulysses-degree 2 x --ring-degree 1" plan --seq 4096 --heads 8 --ranks 4 --sequence-parallel-size 4 --ulysses-degree 2 --ring-degree 1
# Errors as data (core/param_error.h): every parameter the library's error names is printed as
# the flag, also where no value follows it (which no guess from the prose would find).
expect_exit2 "--model 'llama3-8b' is a language model: give --seq (prompt tokens) or --cached and --new, not --frames, --height and --width" plan --model llama3-8b --frames 5

# plan --top N prints N ranked rows (and --json details N meshes' collectives).
wan="plan --model wan2.1-t2v-14b --height 240 --width 432 --frames 33 --ranks 8"
for n in 2 5; do
  rows=$("$bin" $wan --top $n | grep -cE '^  [0-9]+ +[12] +[0-9]+ +[0-9]+ +[0-9]+ ')
  [ "$rows" -eq $n ] && ok || bad "plan --top $n printed $rows rows"
done

# plan --no-guidance: one branch, so no mesh with cfg 2.
"$bin" $wan --top 0 --json >"$tmp/cfg.json"
py 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["guidance_branches"] == 2 and any(m["cfg"] == 2 for m in d["meshes"]) else 1)' "$tmp/cfg.json" && ok || bad "plan: no cfg 2 mesh with guidance"
"$bin" $wan --top 0 --no-guidance --json >"$tmp/nocfg.json"
py 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["guidance_branches"] == 1 and d["meshes"] and all(m["cfg"] == 1 for m in d["meshes"]) else 1)' "$tmp/nocfg.json" && ok || bad "plan --no-guidance still has cfg 2 meshes"

# plan --ranks-per-node: a ring of 8 over nodes of 2 crosses nodes (slower links) where one node
# of 8 does not: its transfers are inter-node and its layer takes longer (the cost model's
# predicted seconds, the same on every run: no clock is read).
ring8="$wan --cfg 1 --tp 1 --ring-degree 8 --strategy ring --layout zigzag --top 1 --json"
"$bin" $ring8 --ranks-per-node 8 >"$tmp/rpn8.json"; "$bin" $ring8 --ranks-per-node 2 >"$tmp/rpn2.json"
py 'import json,sys
a, b = (json.load(open(x))["meshes"][0] for x in sys.argv[1:3])
inter = lambda m: any(c["inter_node"] for c in m["collectives"])
sys.exit(0 if not inter(a) and inter(b) and b["layer_seconds"] > 1.5 * a["layer_seconds"] and b["exposed_comm_seconds"] > a["exposed_comm_seconds"] else 1)' "$tmp/rpn8.json" "$tmp/rpn2.json" \
  && ok || bad "plan --ranks-per-node 2 does not cross nodes or cost more"

# Measured K/V bytes beside the predicted ones: equal where blocks are copied (allgather, MPI
# ring); under threads the ring borrows its peers' blocks, so it allocates only its own shard.
out=$("$bin" run --strategy allgather --ranks 3 --seq 301 --heads 2 --head-dim 16 --repeat 1 --json)
[ "$(json_get "$out" measured_kv_bytes_per_rank)" = "$(json_get "$out" peak_kv_bytes_per_rank)" ] && ok || bad "allgather: measured K/V differs from predicted: $out"
out=$("$bin" run --strategy ring --ranks 3 --seq 301 --heads 2 --head-dim 16 --repeat 1 --json)
py 'import json,sys; d=json.loads(sys.argv[1]); own=[t*2*2*16*4 for t in d["tokens_per_rank"]]
sys.exit(0 if d["measured_kv_bytes_per_rank"] == own and all(p > o for p, o in zip(d["peak_kv_bytes_per_rank"], own)) else 1)' "$out" && ok || bad "threads ring: measured K/V is not the own shard: $out"
if [ -n "$mpiexec" ]; then
  out=$(mpirun_n 3 "$bin" run --backend mpi --strategy ring --seq 301 --heads 2 --head-dim 16 --repeat 1 --json)
  [ "$(json_get "$out" measured_kv_bytes_per_rank)" = "$(json_get "$out" peak_kv_bytes_per_rank)" ] && ok || bad "mpi ring: measured K/V differs from predicted: $out"
fi

# Progress on stderr: on a terminal (SEQPAR_PROGRESS=1 stands for one here), never with --json,
# and not when stderr is a file or pipe.
err=$(SEQPAR_PROGRESS=1 "$bin" run --ranks 2 --seq 64 --heads 2 --repeat 2 --verify 2>&1 >/dev/null)
printf '%s' "$err" | grep -q "^seqpar run: 3/3 calls" \
  && printf '%s' "$err" | grep -q "^seqpar run: verifying against the single-rank reference" \
  && ok || bad "run: no progress lines: $err"
err=$(SEQPAR_PROGRESS=1 "$bin" run --ranks 2 --seq 64 --heads 2 --repeat 1 --json 2>&1 >/dev/null)
[ -z "$err" ] && ok || bad "run --json printed progress: $err"
err=$("$bin" run --ranks 2 --seq 64 --heads 2 --repeat 1 2>&1 >/dev/null)
[ -z "$err" ] && ok || bad "run printed progress without a terminal: $err"
err=$(SEQPAR_PROGRESS=1 "$bin" model --preset tiny-llm --prompt-len 16 --decode 3 2>&1 >/dev/null)
printf '%s' "$err" | grep -q "^seqpar model: 3/3 tokens of the mesh" && ok || bad "model: no progress: $err"
err=$(SEQPAR_PROGRESS=1 "$bin" plan --seq 4096 --heads 8 --ranks 8 --simulate --sim-ranks 2:8 2>&1 >/dev/null)
printf '%s' "$err" | grep -q "^seqpar plan: \([0-9]*\)/\1 simulated meshes" && ok || bad "plan --simulate: no progress: $err"

# The program's version, and a misspelt flag answered with the nearest one.
[ "$("$bin" --version)" = "$("$bin" info --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])')" ] \
  && ok || bad "--version differs from info's version"
expect_exit2 "not expected: ring --stratgy (did you mean --strategy?)" run --stratgy ring
expect_exit2 "(did you mean --prompt-ids?)" generate --prompt-id 1
expect_exit2 "--preset 'wan2.1' is unknown; valid: wan2.1-t2v-1.3b" model --preset wan2.1
# A parameter the subcommand has no flag for is not written as a flag.
expect_exit2 "needs heads 4 divisible by the Ulysses degree 8" model --preset tiny-dit --ulysses-degree 8 --ulysses-mode strict --pad
expect_exit2 "downloads nothing: fetch a hub model first (huggingface-cli download Org/model" \
  generate --model Org/model --prompt-ids 1

echo "test_cli_flags: $pass passed, $fail failed"
[ $fail -eq 0 ]
