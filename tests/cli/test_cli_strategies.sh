#!/usr/bin/env bash
# The command line of the strategies beyond ring/allgather and of `seqpar model`: verification on
# both backends, the JSON keys, and every invalid combination exiting 2 with one line.
# usage: test_cli_strategies.sh path/to/seqpar [path/to/mpiexec]
set -u
bin=${1:?usage: test_cli_strategies.sh path/to/seqpar [mpiexec]}
mpiexec=${2:-}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
check_bad() { expect_exit2 "$@"; }  # <expected text> <seqpar args...>

# 1. ulysses, usp, padding, joint attention, decode: verified on threads.
small="--head-dim 32 --verify --json"
for layout in contiguous striped zigzag; do
  expect_ok "ulysses $layout" "$bin" run --strategy ulysses --layout $layout --ranks 4 --seq 301 --heads 6 --kv-heads 2 --causal $small
  expect_ok "usp $layout" "$bin" run --strategy usp --ulysses-degree 2 --ring-degree 2 --layout $layout --ranks 4 --seq 301 --heads 4 $small
done
expect_ok "ulysses odd heads (2,6,3)" "$bin" run --strategy ulysses --ranks 2 --seq 6 --heads 3 $small
expect_ok "ulysses (4,9,30)" "$bin" run --strategy ulysses --ranks 4 --seq 9 --heads 30 --causal $small
expect_ok "ulysses 7 heads on 4 ranks" "$bin" run --strategy ulysses --ranks 4 --seq 64 --heads 7 $small
expect_ok "strict + pad" "$bin" run --strategy ulysses --ulysses-mode strict --pad --ranks 8 --seq 3645 --heads 8 --head-dim 16 --verify --json --repeat 1
expect_ok "ring pad zigzag" "$bin" run --strategy ring --pad --layout zigzag --ranks 4 --seq 1001 --heads 2 --causal $small
expect_ok "joint ring" "$bin" run --strategy ring --ranks 3 --seq 200 --text-tokens 17 --heads 4 $small
expect_ok "joint usp" "$bin" run --strategy usp --ranks 4 --seq 200 --text-tokens 17 --heads 4 $small
# The ranks follow from the degrees when --ranks is not given (the README's usp line).
expect_ok "usp 2 x 2 without --ranks" "$bin" run --strategy usp --ulysses-degree 2 --ring-degree 2 --seq 256 --heads 8 --causal $small
out=$("$bin" run --strategy ulysses --ulysses-degree 3 --seq 99 --heads 6 --head-dim 8 --json --repeat 1)
[ "$(json_get "$out" ranks)" = 3 ] && ok || bad "--ulysses-degree 3 alone: ranks $(json_get "$out" ranks)"
expect_ok "passq" "$bin" run --strategy passq --ranks 4 --cached 4096 --new 5 --heads 4 --kv-heads 2 --causal $small
expect_ok "passkv" "$bin" run --strategy passkv --ranks 3 --cached 1000 --new 64 --heads 4 --causal $small
expect_ok "bf16 usp" "$bin" run --strategy usp --ranks 4 --seq 256 --heads 4 --dtype bf16 --causal $small
out=$("$bin" run --strategy auto --ranks 4 --cached 12480 --new 320 --heads 128 --kv-heads 8 --head-dim 8 --causal --json --repeat 1 --hardware h100)
# Meta's rule says pass-Q here; on one H100 node (NVLink) the replayed schedules hide pass-KV's
# transfers, and auto takes the fastest replay.
[ "$(json_get "$out" rule_choice)" = "passq" ] && ok || bad "auto's rule chose $(json_get "$out" rule_choice), want passq"
[ "$(json_get "$out" choice)" = "passkv" ] && ok || bad "auto chose $(json_get "$out" choice), want passkv: $(json_get "$out" choice_reason)"
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if d["threshold_tokens"] > 320 else 1)' "$out" && ok || bad "threshold_tokens"
out=$("$bin" run --strategy auto --ranks 4 --cached 1000 --new 1000 --heads 32 --kv-heads 2 --head-dim 8 --causal --json --repeat 1 --hardware h100)
[ "$(json_get "$out" choice)" = "passkv" ] && ok || bad "auto on half-new tokens chose $(json_get "$out" choice)"
# Without --hardware, auto decides for this machine (the local profile, as calibrated).
out=$("$bin" run --strategy auto --ranks 2 --cached 256 --new 4 --heads 4 --causal --json --repeat 1)
[ "$(json_get "$out" hardware)" = "local" ] && ok || bad "auto's default profile: $(json_get "$out" hardware)"
# One rank over a cache: auto runs it locally (the queries over the own cache).
expect_ok "auto on one rank over a cache" "$bin" run --strategy auto --ranks 1 --cached 100 --new 4 --heads 4 --causal $small
# ring pass-Q: T = 1 (three ranks own no query), T not divisible by N, T in the thousands.
expect_ok "passq ring T=1" "$bin" run --strategy passq --schedule ring --ranks 4 --cached 4096 --new 1 --heads 4 --kv-heads 2 --causal $small
expect_ok "passq ring T=7" "$bin" run --strategy passq --schedule ring --ranks 3 --cached 1000 --new 7 --heads 4 --dtype bf16 --causal $small
expect_ok "passq ring T=2048" "$bin" run --strategy passq --schedule ring --ranks 4 --cached 512 --new 2048 --heads 2 --kv-heads 1 --head-dim 16 --causal --verify --json --repeat 1
out=$("$bin" run --strategy passq --schedule ring --ranks 4 --cached 1024 --new 64 --heads 4 --head-dim 16 --causal --json --repeat 1)
[ "$(json_get "$out" schedule)" = "ring" ] && ok || bad "passq ring: schedule $(json_get "$out" schedule)"
# auto replays the three schedules: thousands of new tokens over a long cache take ring pass-Q,
# one new token all-gather pass-Q; the predicted times and Meta's rule are in the JSON.
# (A profile of one rank per node whose rates make a small shape behave as a long cache does.)
ring_hw=$(mktemp --suffix=.json)
trap 'rm -f "$ring_hw"' EXIT
echo '{"name": "cli-ring", "attention_flops": 1e12, "intra_node_bw": 2e9, "inter_node_bw": 2e9, "latency_s": 1e-6, "ranks_per_node": 1, "memory_bytes": 1e12}' > "$ring_hw"
out=$("$bin" run --strategy auto --ranks 4 --cached 4096 --new 256 --heads 4 --head-dim 16 --causal --verify --json --repeat 1 --hardware "$ring_hw")
[ "$(json_get "$out" ok)" = "True" ] && ok || bad "auto (ring pass-Q) not ok: $out"
[ "$(json_get "$out" choice)/$(json_get "$out" choice_schedule)" = "passq/ring" ] && ok || bad "auto (4096 cached, 256 new) chose $(json_get "$out" choice)/$(json_get "$out" choice_schedule): $(json_get "$out" choice_reason)"
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); p=d["predicted_seconds"]; sys.exit(0 if p["passq_ring"] < p["passq"] and p["passq_ring"] < p["passkv"] and "Meta" in d["choice_reason"] else 1)' "$out" && ok || bad "auto predicted_seconds: $out"
out=$("$bin" run --strategy auto --ranks 4 --cached 4096 --new 1 --heads 4 --head-dim 16 --causal --json --repeat 1 --hardware "$ring_hw")
[ "$(json_get "$out" choice)/$(json_get "$out" choice_schedule)" = "passq/default" ] && ok || bad "auto (one new token) chose $(json_get "$out" choice)/$(json_get "$out" choice_schedule): $(json_get "$out" choice_reason)"
check_bad "'ring' with passq" run --ranks 2 --strategy passkv --schedule ring --cached 100 --new 1 --heads 4
out=$("$bin" run --strategy ring --layout zigzag --ranks 8 --seq 8192 --heads 1 --head-dim 8 --causal --json --repeat 1)
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if d["work_imbalance"] <= 1.05 else 1)' "$out" && ok || bad "zigzag imbalance"
out=$("$bin" run --strategy ring --layout contiguous --ranks 8 --seq 8192 --heads 1 --head-dim 8 --causal --json --repeat 1)
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if 1.8 <= d["work_imbalance"] <= 2.0 else 1)' "$out" && ok || bad "contiguous imbalance"

# 2. invalid combinations: exit 2, one line, naming the cause.
base="run --ranks 4 --seq 64 --heads 4 --head-dim 16"
check_bad "valid degrees here" $base --strategy ulysses --ulysses-mode strict --heads 5
check_bad "remainder" $base --strategy ulysses --ulysses-mode strict --seq 63
check_bad "must equal the 4 ranks" $base --strategy usp --ulysses-degree 3 --ring-degree 2
check_bad "use --strategy usp" $base --strategy ring --ulysses-degree 2
check_bad "drop --causal" $base --text-tokens 4 --causal
check_bad "--cached" $base --strategy passq
check_bad "--ulysses-mode" $base --strategy ulysses --ulysses-mode fast
check_bad "--cached" run --ranks 4 --strategy passq --cached 2 --new 1 --heads 4
check_bad "does not run over a K/V cache" run --ranks 2 --strategy ulysses --cached 100 --new 1 --heads 4
check_bad "--hardware" run --ranks 2 --strategy auto --cached 100 --new 1 --heads 4 --hardware tpu

# ring with schedule steal: verified, balanced on contiguous shards; only with ring, contiguous.
expect_ok "ring steal" "$bin" run --strategy ring --schedule steal --ranks 4 --seq 517 --heads 4 --kv-heads 2 --causal $small
expect_ok "ring steal pad" "$bin" run --strategy ring --schedule steal --pad --ranks 3 --seq 1000 --heads 2 --causal $small
out=$("$bin" run --strategy ring --schedule steal --ranks 8 --seq 8192 --heads 1 --head-dim 8 --causal --json --repeat 1)
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if d["work_imbalance"] <= 1.05 and d["ok"] else 1)' "$out" && ok || bad "steal imbalance: $out"
check_bad "contiguous" run --ranks 4 --seq 64 --heads 4 --strategy ring --schedule steal --layout zigzag
check_bad "schedule" run --ranks 4 --seq 64 --heads 4 --strategy ulysses --schedule steal
out=$("$bin" plan --seq 65536 --heads 32 --kv-heads 8 --head-dim 128 --causal --ranks 8 --schedule steal --json)
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); m=d["meshes"]; sys.exit(0 if m and all(x["schedule"] == "steal" and x["strategy"] == "ring" for x in m) else 1)' "$out" && ok || bad "plan --schedule steal"
# 2b. packed documents (varlen): every strategy verified with the document mask; requests over a
# cache; malformed lists exit 2 naming the flag.
docs="--seq-lens 300,17,1,90,211,5"
for layout in contiguous zigzag; do
  for st in ring allgather ulysses usp; do
    expect_ok "varlen $st $layout" "$bin" run --strategy $st --layout $layout --ranks 4 $docs --heads 4 --kv-heads 2 --causal $small
  done
  expect_ok "varlen ring const-max $layout" "$bin" run --strategy ring --softmax const-max --layout $layout --ranks 3 $docs --heads 4 --causal $small
  expect_ok "varlen passq $layout" "$bin" run --strategy passq --layout $layout --ranks 3 --cached-lens 50,1,120,20 --new 1 --heads 4 --kv-heads 2 --causal $small
  expect_ok "varlen passq ring $layout" "$bin" run --strategy passq --schedule ring --layout $layout --ranks 3 --cached-lens 50,1,120,20 --new-lens 3,1,9,1 --heads 4 --kv-heads 2 --causal $small
  expect_ok "varlen passkv $layout" "$bin" run --strategy passkv --layout $layout --ranks 3 --cached-lens 50,1,120,20 --new-lens 3,1,9,1 --heads 4 --causal $small
done
expect_ok "varlen ulysses strict pad" "$bin" run --strategy ulysses --ulysses-mode strict --pad --ranks 4 $docs --heads 4 --causal $small
out=$("$bin" run --strategy ring --layout zigzag --ranks 4 $docs --seq 624 --heads 2 --head-dim 8 --causal --json --repeat 1)
[ "$(json_get "$out" seq_lens)" = "[300, 17, 1, 90, 211, 5]" ] && ok || bad "seq_lens in the JSON: $(json_get "$out" seq_lens)"
check_bad "--seq-lens item 2 ''" $base --seq-lens 3,,61
check_bad "--seq-lens item 2 '0'" $base --seq-lens 3,0,61
check_bad "--seq-lens item 1 'x'" $base --seq-lens x,64
check_bad "--seq-lens item 1 '1.5'" $base --seq-lens 1.5,62
check_bad "--seq-lens sum to 60 but --seq is 64" $base --seq-lens 30,30
check_bad "--text-tokens" run --ranks 2 --seq-lens 30,30 --text-tokens 4 --heads 4
check_bad "--cached-lens item 2 '-3'" run --ranks 2 --strategy passq --cached-lens 5,-3 --new 1 --heads 4
check_bad "--new-lens has 1 items" run --ranks 2 --strategy passq --cached-lens 5,3 --new-lens 1 --heads 4
check_bad "--new-lens needs --cached-lens" run --ranks 2 --strategy passq --cached 8 --new-lens 1 --heads 4

# 3. seqpar model: verified against one rank.
expect_ok "dit cfg2 tp2 ring2" "$bin" model --preset tiny-dit --cfg 2 --tp 2 --ring-degree 2 --verify --json
expect_ok "dit usp zigzag pad" "$bin" model --preset tiny-dit --ulysses-degree 2 --ring-degree 2 --layout zigzag --pad --verify --json
expect_ok "dit 4 steps" "$bin" model --preset tiny-dit --ulysses-degree 4 --steps 4 --verify --json
expect_ok "llm tp2 ring2" "$bin" model --preset tiny-llm --tp 2 --ring-degree 2 --prompt-len 1000 --decode 16 --verify --json
out=$("$bin" model --preset tiny-llm --ulysses-degree 2 --prompt-len 200 --decode 4 --verify --json)
[ "$(json_get "$out" tokens_match)" = "True" ] && ok || bad "llm tokens differ: $out"
# --decode N: N tokens after the prompt
[ "$(json_get "$out" tokens | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" = 4 ] \
  && ok || bad "--decode 4 did not give 4 tokens: $out"
tmp=$(mktemp -d)
"$bin" model --preset tiny-llm --prompt-len 32 --decode 2 --save-weights "$tmp/w.safetensors" >/dev/null && ok || bad "save weights"
expect_ok "llm from safetensors" "$bin" model --preset tiny-llm --weights "$tmp/w.safetensors" --ring-degree 2 --prompt-len 32 --decode 2 --verify --json
head -c 500 "$tmp/w.safetensors" > "$tmp/trunc.safetensors"
check_bad "trunc.safetensors" model --preset tiny-llm --weights "$tmp/trunc.safetensors"
check_bad "no tensor" model --preset tiny-dit --weights "$tmp/w.safetensors"
rm -rf "$tmp"
# Every schedule and softmax inside the models (through the one entry point): verified against
# one rank; the chunks over the cache pinned to ring pass-Q, or chosen by auto.
expect_ok "llm ring steal" "$bin" model --preset tiny-llm --ring-degree 4 --schedule steal --prompt-len 203 --decode 3 --verify --json
expect_ok "llm const-max" "$bin" model --preset tiny-llm --ring-degree 2 --ulysses-degree 2 --softmax const-max --prompt-len 203 --decode 3 --verify --json
expect_ok "dit const-max" "$bin" model --preset tiny-dit --ring-degree 4 --softmax const-max --verify --json
expect_ok "llm chunks passq ring" "$bin" model --preset tiny-llm --ring-degree 3 --prompt-len 100 --decode 3 --prefill-chunk 16 --chunk-strategy passq --chunk-schedule ring --verify --json
out=$("$bin" model --preset tiny-llm --ring-degree 4 --prompt-len 100 --decode 2 --prefill-chunk 30 --hardware cpu-ethernet --verify --json)
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); c=d["prefill_chunks"][1:]; sys.exit(0 if d["ok"] and c and all("fastest replayed schedule" in x["reason"] and "schedule" in x for x in c) else 1)' "$out" \
  && ok || bad "llm chunks by auto: $out"
# --kv-cache-dtype on the llm presets: the cache rounded as stored, the chunks after the first over
# it (the reference takes the same chunks), against one rank; the rounding changes the logits.
for kv in bf16 fp16; do
  out=$("$bin" model --preset tiny-llm --tp 2 --ring-degree 2 --prompt-len 300 --decode 8 --prefill-chunk 64 --chunk-strategy passq --kv-cache-dtype $kv --verify --json)
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if d["ok"] and d["tokens_match"] and d["kv_cache_dtype"] == sys.argv[2] else 1)' "$out" $kv \
    && ok || bad "llm --kv-cache-dtype $kv: $out"
done
rms() { "$bin" model --preset tiny-llm --ring-degree 2 --prompt-len 100 --decode 8 --kv-cache-dtype "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["output_rms"])'; }
[ "$(rms fp32)" != "$(rms bf16)" ] && ok || bad "--kv-cache-dtype bf16 left the logits as fp32's"
check_bad "--kv-cache-dtype 'int4' is unknown; valid: fp32, bf16, fp16" model --preset tiny-llm --kv-cache-dtype int4
check_bad "--kv-cache-dtype is for llm presets (tiny-llm, llama3-8b, ...), not tiny-dit" model --preset tiny-dit --kv-cache-dtype bf16
check_bad "leave out --decode, --prefill-chunk and --kv-cache-dtype" model --preset tiny-llm --seq-lens 30,40 --kv-cache-dtype fp16
check_bad "--schedule 'steal' does not apply to --strategy 'usp' (--ulysses-degree 2, --ring-degree 2); valid: 'steal' with ring" model --preset tiny-dit --ring-degree 2 --ulysses-degree 2 --schedule steal
check_bad "--softmax 'const-max' needs a ring: valid with --strategy 'ring' or 'usp' (its ring part), not 'allgather'" model --preset tiny-dit --ring-degree 2 --strategy allgather --softmax const-max
check_bad "--chunk-schedule ring does not apply to --chunk-strategy passkv" model --preset tiny-llm --ring-degree 2 --prefill-chunk 8 --chunk-strategy passkv --chunk-schedule ring
check_bad "does not divide the 4 heads" model --preset tiny-dit --tp 3
check_bad "4k+1" model --preset tiny-dit --frames 8
check_bad "multiple of 16" model --preset tiny-dit --height 100
check_bad "diffusion" model --preset tiny-llm --cfg 2
check_bad "unknown" model --preset gpt-5
check_bad "remainder 5" model --preset tiny-dit --frames 33 --height 240 --width 432 --ulysses-degree 4 --ring-degree 2 --ulysses-mode strict

# 4. mpi backend.
if [ -n "$mpiexec" ]; then
  mpi=("$mpiexec" --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none)
  expect_ok "mpi usp" "${mpi[@]}" -n 4 "$bin" run --backend mpi --strategy usp --ulysses-degree 2 --seq 517 --heads 4 --causal $small
  expect_ok "mpi passq" "${mpi[@]}" -n 4 "$bin" run --backend mpi --strategy passq --cached 2000 --new 3 --heads 4 --causal $small
  expect_ok "mpi passq ring" "${mpi[@]}" -n 4 "$bin" run --backend mpi --strategy passq --schedule ring --cached 2000 --new 3 --heads 4 --causal $small
  expect_ok "mpi ring steal" "${mpi[@]}" -n 4 "$bin" run --backend mpi --strategy ring --schedule steal --seq 517 --heads 4 --causal $small
  expect_ok "mpi varlen usp zigzag" "${mpi[@]}" -n 4 "$bin" run --backend mpi --strategy usp --ulysses-degree 2 --layout zigzag --seq-lens 300,17,1,90,211 --heads 4 --causal $small
  expect_ok "mpi varlen passkv" "${mpi[@]}" -n 3 "$bin" run --backend mpi --strategy passkv --cached-lens 50,1,120 --new-lens 2,1,3 --heads 4 --causal $small
  expect_ok "mpi joint" "${mpi[@]}" -n 2 "$bin" run --backend mpi --strategy ulysses --seq 100 --text-tokens 9 --heads 4 $small
  expect_ok "mpi model dit" "${mpi[@]}" -n 4 "$bin" model --backend mpi --preset tiny-dit --cfg 2 --ring-degree 2 --verify --json
  expect_ok "mpi model llm" "${mpi[@]}" -n 4 "$bin" model --backend mpi --preset tiny-llm --tp 2 --ulysses-degree 2 --prompt-len 300 --decode 8 --verify --json
else
  echo "skip: no mpiexec given"
fi

echo "cli strategies and models: $pass passed, $fail failed"
[ $fail -eq 0 ]
