#!/usr/bin/env bash
# seqpar plan and seqpar calibrate: JSON keys, the worked examples, exit codes and one-line
# errors, profiles from files and the user directory, the SVG. usage: test_plan_cli.sh SEQPAR
set -u
bin=${1:?usage: test_plan_cli.sh path/to/seqpar}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export SEQPAR_PROFILE_DIR="$tmp/profiles"  # never the user's own profiles
. "$(dirname "${BASH_SOURCE[0]}")/../cli/lib.sh"
# py FILE 'expression over d (the JSON object)': exits 0 if true
py() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$1"; }

# 1. The Wan example: S = 3645, 3645 % 8 = 5, ways out, ranked meshes.
"$bin" plan --model wan2.1-t2v-14b --height 240 --width 432 --frames 33 --ranks 8 --json \
  >"$tmp/wan.json"; rc=$?
[ $rc -eq 0 ] && ok || bad "plan wan exited $rc"
py "$tmp/wan.json" 'd["seq_len"] == 3645 and d["remainder"] == 5 and d["sequence_parallel_size"] == 8' \
  && ok || bad "wan: seq_len/remainder"
py "$tmp/wan.json" 'd["divisibility"]["padded_seq"] == 3648 and any(a["parameter"] == "frames" and a["value"] == 29 for a in d["divisibility"]["alternatives"])' \
  && ok || bad "wan: padding / alternatives"
# (step_seconds: the cost model's prediction, the same on every run; no clock is read)
py "$tmp/wan.json" 'len(d["meshes"]) > 0 and all(d["meshes"][i]["step_seconds"] <= d["meshes"][i+1]["step_seconds"] for i in range(len(d["meshes"])-1))' \
  && ok || bad "wan: meshes not ranked"
py "$tmp/wan.json" 'all("reason" in r for r in d["rejected"]) and len(d["rejected"]) > 0' \
  && ok || bad "wan: rejected meshes without reasons"
py "$tmp/wan.json" 'sum(d["meshes"][0]["bytes_sent_per_rank"]) == sum(d["meshes"][0]["bytes_recv_per_rank"])' \
  && ok || bad "wan: bytes sent != received over the group"
text=$("$bin" plan --model wan2.1-t2v-14b --height 240 --width 432 --frames 33 --ranks 8)
grep -q "3645 % 8 = 5" <<<"$text" && ok || bad "wan text lacks '3645 % 8 = 5'"
grep -q "padding (--pad): to 3648" <<<"$text" && ok || bad "wan text lacks the padding"
grep -q -- "--frames 29" <<<"$text" && ok || bad "wan text lacks the nearest frames"
# A preset answers to its aliases: flux-dev is flux.1-dev.
"$bin" plan --model flux-dev --height 1024 --width 1024 --ranks 2 --json >"$tmp/flux.json" \
  && py "$tmp/flux.json" 'd["model"] == "flux.1-dev" and d["seq_len"] == 4096' \
  && ok || bad "plan --model flux-dev is not flux.1-dev"

# Strategy aliases and the softmax pin.
"$bin" plan --ranks 4 --seq 4096 --heads 8 --strategy all-gather --json >"$tmp/ag.json" \
  && ok || bad "plan --strategy all-gather exited non-zero"
py "$tmp/ag.json" 'all(m["strategy"] == "allgather" for m in d["meshes"])' \
  && ok || bad "all-gather: not the allgather meshes"
"$bin" plan --ranks 4 --seq 4096 --heads 8 --softmax const-max --json >"$tmp/cm.json" \
  && ok || bad "plan --softmax const-max exited non-zero"
py "$tmp/cm.json" 'd["meshes"] and all(m["softmax"] == "const-max" for m in d["meshes"])' \
  && ok || bad "const-max: meshes without the const-max softmax"

# 2. Meta's worked examples (Llama3 405B, 4 ranks of H100, 50 GB/s per rank, 128K tokens).
"$bin" plan --model llama3-405b --ranks 4 --hardware h100 --cached 124800 --new 3200 --json \
  >"$tmp/a.json" && ok || bad "decode a exited non-zero"
py "$tmp/a.json" 'd["choice"] == "passq" and abs(d["threshold_tokens"] - 4945) < 1' \
  && ok || bad "2.5% new tokens should choose passq"
"$bin" plan --model llama3-405b --ranks 4 --hardware h100 --cached 115200 --new 12800 --json \
  >"$tmp/b.json" && ok || bad "decode b exited non-zero"
py "$tmp/b.json" 'd["choice"] == "passkv"' && ok || bad "10% new tokens should choose passkv"

# 3. Invalid requests: exit 2, one line, the cause and an alternative.
expect2() { local pattern=$1; shift; expect_exit2 "$pattern" plan "$@"; }  # "pattern" args...
expect2 "nearest: wan2.1-t2v-14b" --model wan2.1-14b --height 240 --width 432 --frames 33
expect2 "nearest: 240 or 256" --model wan2.1-t2v-14b --height 250 --width 432 --frames 33
expect2 "nearest: 33 or 37" --model wan2.1-t2v-14b --height 240 --width 432 --frames 35
expect2 "--ranks 4" --seq 4 --heads 1 --ranks 8 --hardware local
expect2 "--memory-limit" --model wan2.1-t2v-14b --height 240 --width 432 --frames 33 --ranks 2 --memory-limit 10
expect2 "must be at least 1" --model wan2.1-t2v-14b --height 240 --width 432 --frames 33 --ranks 0
expect2 "h100, h200" --model wan2.1-t2v-14b --height 240 --width 432 --frames 33 --hardware tpu
expect2 "layout" --seq 4096 --heads 8 --layout diagonal

# 4. Bare attention on the local profile, pinned to one strategy.
"$bin" plan --seq 4096 --heads 8 --head-dim 64 --ranks 2 --hardware local --strategy ring \
  --layout zigzag --causal --json >"$tmp/att.json" && ok || bad "bare attention plan failed"
py "$tmp/att.json" 'len(d["meshes"]) == 1 and d["meshes"][0]["strategy"] == "ring" and d["meshes"][0]["layout"] == "zigzag"' \
  && ok || bad "pinned plan should have exactly the ring/zigzag mesh"

# 5. calibrate writes the local profile where plan finds it.
"$bin" calibrate --quick >"$tmp/cal.txt"; rc=$?
[ $rc -eq 0 ] && ok || bad "calibrate --quick exited $rc"
[ -f "$SEQPAR_PROFILE_DIR/local.json" ] && ok || bad "calibrate did not write \$SEQPAR_PROFILE_DIR/local.json"
"$bin" plan --seq 4096 --heads 8 --ranks 2 --hardware local --json >"$tmp/loc.json" && ok \
  || bad "plan --hardware local after calibrate failed"
py "$tmp/loc.json" 'd["hardware"]["source"].endswith("local.json") and "calibrate" in d["hardware"]["description"]' \
  && ok || bad "plan did not read the calibrated profile"
mkdir -p "$tmp/other"  # --out writes into a folder that exists
"$bin" calibrate --quick --json --out "$tmp/other/mine.json" >"$tmp/cal.json" && ok || bad "calibrate --out failed"
"$bin" plan --seq 4096 --heads 8 --ranks 2 --hardware "$tmp/other/mine.json" --json >/dev/null \
  && ok || bad "plan --hardware PATH failed"

# 6. Simulation and the SVG.
"$bin" plan --model wan2.1-t2v-14b --height 720 --width 1280 --frames 81 --ranks 8 \
  --simulate --sim-ranks 8:256 --svg "$tmp/scale.svg" --json >"$tmp/sim.json" && ok \
  || bad "simulate failed"
py "$tmp/sim.json" 'len(d["simulation"]["curves"]) == 4 and d["simulation"]["sizes"][-1] == 256' \
  && ok || bad "simulation curves"
grep -q "</svg>" "$tmp/scale.svg" && ok || bad "no SVG written"
python3 -c "import sys, xml.dom.minidom as m; m.parse(sys.argv[1])" "$tmp/scale.svg" && ok \
  || bad "the SVG is not well-formed XML"

# 7. Bounded work: every request answers or is refused up front with the work and what fits.
# A memory limit nothing meets: the smallest need and the limit that holds it, no search.
expect2 "the smallest needs 0.00736 GB .*no world size up to 64x fits, or --memory-limit 0.00736" \
  --seq 4096 --heads 8 --memory-limit 1e-30
expect2 "no world size up to 64x fits" --model llama3-8b --seq 4097 --ranks 16 --hardware local
# Rates that overflow a step's time.
python3 - "$tmp/slow.json" <<'PY'
import json, sys
p = {"name": "slow", "dtype": "bf16", "attention_flops": 1e-300, "gemm_flops": 1e-300,
     "intra_node_bw": 1e-300, "inter_node_bw": 1e-300, "local_copy_bw": 1e-300,
     "memory_bytes": 1e-300, "ranks_per_node": 8}
json.dump(p, open(sys.argv[1], "w"))
PY
expect2 "not finite.*attention_flops 1e-300" --seq 4096 --heads 8 --hardware "$tmp/slow.json"
# Pinned and simulated plans over a million tokens: the work named, and what would fit.
expect2 "1 mesh (16793600 schedule steps.*more than the limit.*--ranks 2048" \
  --seq 1048576 --heads 8 --ranks 4096 --strategy ring --layout zigzag
expect2 "tokens one by one.*--new " \
  --cached 100000000 --new 100000000 --heads 1 --ranks 8 --layout striped
expect2 "--sim-ranks 8:8192: .*more than the limit.*--sim-ranks 8:256" \
  --seq 1048576 --heads 8 --simulate --sim-ranks 8:8192
# --sim-ranks unset: 8 doubling up to 1024 as far as the limit allows, saying where it stopped.
"$bin" plan --seq 1048576 --heads 8 --simulate --json >"$tmp/sim1m.json" && ok \
  || bad "plan --simulate at 1M tokens exited non-zero"
py "$tmp/sim1m.json" 'd["simulation"]["sizes"] == [8, 16, 32, 64, 128, 256] and "1024 ranks" in d["simulation"]["note"]' \
  && ok || bad "the default simulation at 1M tokens: sizes up to 256 and the note"

echo "plan cli: $pass passed, $fail failed"
[ $fail -eq 0 ]
