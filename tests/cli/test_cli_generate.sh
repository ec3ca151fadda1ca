#!/usr/bin/env bash
# seqpar generate on bad input: a directory without config.json, a config that disagrees with the
# tensors, an index naming a missing shard, unsupported config values, token ids outside the
# vocabulary, a prompt past max_position_embeddings. Each exits 2 with one line naming the file,
# key or tensor and what was expected. Checkpoints are written here (stdlib Python) with zero
# weights; the numerics are tests/python/test_llama_generate.py's.
# usage: test_cli_generate.sh path/to/seqpar [path/to/mpiexec]
set -u
bin=${1:?usage: test_cli_generate.sh path/to/seqpar [mpiexec]}
mpiexec=${2:-}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# make_ckpt DIR LAYERS SHARDS [config overrides as JSON]: a Llama of hidden 8, 2 heads over 1 kv
# head, intermediate 16, vocab 16, max_position_embeddings 12, with tensors for LAYERS layers in
# SHARDS files (1: model.safetensors; more: model-0000k-of-0000n + index). The config says
# num_hidden_layers LAYERS unless overridden. Weights are 0, or with FILL ({"name suffix": value,
# "*": value}) the value of the first suffix that ends the name, else "*".
make_ckpt() {
  python3 - "$@" <<'PY'
import json, os, struct, sys
d, layers, shards = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
over = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
fill = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
os.makedirs(d, exist_ok=True)
cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=8,
           intermediate_size=16, num_hidden_layers=layers, num_attention_heads=2,
           num_key_value_heads=1, vocab_size=16, max_position_embeddings=12, rms_norm_eps=1e-5,
           rope_theta=10000.0, tie_word_embeddings=True, eos_token_id=None)
cfg.update(over)
json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
t = {"model.embed_tokens.weight": [16, 8], "model.norm.weight": [8]}
for i in range(layers):
    p = f"model.layers.{i}."
    t.update({p + "input_layernorm.weight": [8], p + "post_attention_layernorm.weight": [8],
              p + "self_attn.q_proj.weight": [8, 8], p + "self_attn.k_proj.weight": [4, 8],
              p + "self_attn.v_proj.weight": [4, 8], p + "self_attn.o_proj.weight": [8, 8],
              p + "mlp.gate_proj.weight": [16, 8], p + "mlp.up_proj.weight": [16, 8],
              p + "mlp.down_proj.weight": [8, 16]})
names = sorted(t)
groups = [names[k::shards] for k in range(shards)]
def write(path, group):
    header, off = {}, 0
    for n in group:
        size = 4 * eval("*".join(map(str, t[n])))
        header[n] = {"dtype": "F32", "shape": t[n], "data_offsets": [off, off + size]}
        off += size
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    data = b""
    for n in group:
        v = next((fill[k] for k in fill if k != "*" and n.endswith(k)), fill.get("*", 0.0))
        data += struct.pack("<f", v) * (header[n]["data_offsets"][1] // 4 - header[n]["data_offsets"][0] // 4)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)
if shards == 1:
    write(os.path.join(d, "model.safetensors"), names)
else:
    wm = {}
    for k, g in enumerate(groups):
        f = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        write(os.path.join(d, f), g)
        wm.update({n: f for n in g})
    json.dump({"metadata": {}, "weight_map": wm},
              open(os.path.join(d, "model.safetensors.index.json"), "w"))
PY
}

gen() { echo generate --max-new-tokens 2 --quiet "$@"; }

# A good directory runs (zero weights: every logit is 0, token 0 wins), sharded too.
make_ckpt "$tmp/good" 1 1
make_ckpt "$tmp/sharded" 2 3
for dir in good sharded; do
  out=$("$bin" $(gen --model "$tmp/$dir" --prompt-ids 1,2,3 --json) 2>&1); rc=$?
  [ $rc -eq 0 ] && ok || bad "generate $dir exited $rc: $out"
  [ "$(json_get "$out" tokens 2>/dev/null)" = "[0, 0]" ] && ok || bad "generate $dir: $out"
done
out=$("$bin" $(gen --model "$tmp/good" --prompt-ids 1,2,3 --json --tp 2 --ring-degree 2) 2>&1)
for key in tokens prompt_tokens prefill_seconds decode_seconds_per_token decode_tokens_per_second \
           tokens_per_second weight_bytes_per_rank; do
  json_get "$out" "$key" >/dev/null 2>&1 && ok || bad "generate --json lacks $key: $out"
done

# --trace: a Chrome/Perfetto timeline of the prefill and the decoded tokens (not the load): per
# rank (pid) one slice per layer's self_attn and mlp half for the prefill and each decoded token,
# the attention kernel, and the collectives on the comm lane; on both backends.
check_gen_trace() {  # check_gen_trace <description> <file> <ranks> <layers> <passes>
  python3 -c '
import json, sys
path, ranks, layers, passes = sys.argv[1], *map(int, sys.argv[2:5])
ev = json.load(open(path))["traceEvents"]
x = [e for e in ev if e["ph"] == "X"]
assert {e["pid"] for e in x} == set(range(ranks)), {e["pid"] for e in x}
for r in range(ranks):
    mine = [e for e in x if e["pid"] == r]
    for l in range(layers):
        for half in ("self_attn", "mlp"):
            n = sum(e["name"] == f"layer {l} {half}" and e["cat"] == "model" for e in mine)
            assert n == passes, (r, l, half, n)
    assert any(e["name"] == "attention" and e["cat"] == "kernel" for e in mine), r
    assert any(e["tid"] == 1 and e["cat"] == "comm" for e in mine), r
assert all(e.keys() >= {"ts", "dur"} for e in x)  # fields of the format (clock readings: not judged)
' "$2" "$3" "$4" "$5" && ok || bad "$1: trace $2"
}
"$bin" $(gen --model "$tmp/sharded" --prompt-ids 1,2,3 --max-new-tokens 3 --tp 2 \
         --ring-degree 2 --trace "$tmp/gen_trace.json") >/dev/null; rc=$?
[ $rc -eq 0 ] && ok || bad "generate --trace exited $rc"
check_gen_trace "threads" "$tmp/gen_trace.json" 4 2 3
"$bin" $(gen --model "$tmp/good" --prompt-ids 1 --trace "$tmp/nodir/t.json") >/dev/null 2>&1
[ $? -eq 1 ] && ok || bad "generate --trace into a missing folder: want exit 1"
expect_exit2 "--trace '$tmp/good/model.safetensors' is the input" \
  $(gen --model "$tmp/good" --prompt-ids 1 --trace "$tmp/good/model.safetensors")
expect_exit2 "--trace '$tmp/o3' is also the file of --output" \
  $(gen --model "$tmp/good" --prompt-ids 1 --output "$tmp/o3" --trace "$tmp/o3")
if [ -n "$mpiexec" ]; then
  timeout -s KILL 90 "$mpiexec" --allow-run-as-root --oversubscribe \
    --mca btl_vader_single_copy_mechanism none -n 2 "$bin" $(gen --model "$tmp/sharded" \
    --prompt-ids 1,2,3 --tp 2 --backend mpi --trace "$tmp/gen_trace_mpi.json") >/dev/null
  [ $? -eq 0 ] && ok || bad "mpi: generate --trace failed"
  check_gen_trace "mpi" "$tmp/gen_trace_mpi.json" 2 2 2
fi

# The directory and its files.
mkdir -p "$tmp/empty"
expect_exit2 "config.json: missing" $(gen --model "$tmp/empty" --prompt-ids 1)
expect_exit2 "not a directory" $(gen --model "$tmp/nowhere" --prompt-ids 1)
cp "$tmp/good/config.json" "$tmp/empty/config.json"
expect_exit2 "neither model.safetensors nor model.safetensors.index.json" \
  $(gen --model "$tmp/empty" --prompt-ids 1)
make_ckpt "$tmp/noshard" 1 2
rm "$tmp/noshard/model-00002-of-00002.safetensors"
expect_exit2 "index.json: names shard 'model-00002-of-00002.safetensors'" \
  $(gen --model "$tmp/noshard" --prompt-ids 1)

# The config against the tensors.
make_ckpt "$tmp/shape" 1 1 '{"intermediate_size": 32}'
expect_exit2 "tensor 'model.layers.0.mlp.gate_proj.weight' has shape \[16, 8\]; config.json: .*intermediate_size 32.* expects \[32, 8\]" \
  $(gen --model "$tmp/shape" --prompt-ids 1)
make_ckpt "$tmp/layer" 1 1 '{"num_hidden_layers": 2}'
expect_exit2 "no tensor 'model.layers.1.input_layernorm.weight'.*num_hidden_layers 2" \
  $(gen --model "$tmp/layer" --prompt-ids 1)
make_ckpt "$tmp/extra" 2 1 '{"num_hidden_layers": 1}'
expect_exit2 "tensor 'model.layers.1..*' is not a parameter of the model" \
  $(gen --model "$tmp/extra" --prompt-ids 1)
make_ckpt "$tmp/untied" 1 1 '{"tie_word_embeddings": false}'
expect_exit2 "no tensor 'lm_head.weight'" $(gen --model "$tmp/untied" --prompt-ids 1)

# Unsupported config values: one line naming the key and what is supported.
make_ckpt "$tmp/yarn" 1 1 '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}'
expect_exit2 "config.json: rope_scaling.rope_type \"yarn\" is not supported; valid: llama3, default" \
  $(gen --model "$tmp/yarn" --prompt-ids 1)
make_ckpt "$tmp/arch" 1 1 '{"architectures": ["MistralForCausalLM"]}'
expect_exit2 "architectures .* is not supported; valid: \[\"LlamaForCausalLM\", \"Qwen2ForCausalLM\", \"Qwen3ForCausalLM\"\]" \
  $(gen --model "$tmp/arch" --prompt-ids 1)
make_ckpt "$tmp/l3" 1 1 '{"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}'
expect_exit2 "rope_scaling.low_freq_factor is missing" $(gen --model "$tmp/l3" --prompt-ids 1)
make_ckpt "$tmp/kv" 1 1 '{"num_key_value_heads": 3}'
expect_exit2 "num_key_value_heads 3 is out of range; valid: 1 to 2" \
  $(gen --model "$tmp/kv" --prompt-ids 1)

# Prompts.
expect_exit2 "prompt token 16 at position 1 is outside the vocabulary of .*vocab_size 16" \
  $(gen --model "$tmp/good" --prompt-ids 3,16)
expect_exit2 "prompt token -1 at position 0" $(gen --model "$tmp/good" --prompt-ids -1)
expect_exit2 "'x' is not a token id" $(gen --model "$tmp/good" --prompt-ids 1,x)
expect_exit2 "give the prompt as one of --prompt-ids" $(gen --model "$tmp/good")
expect_exit2 "give the prompt as one of --prompt-ids" \
  $(gen --model "$tmp/good" --prompt-ids 1 --prompt-ids-file "$tmp/good/config.json")
expect_exit2 "--prompt-ids-file '$tmp/nofile.npy': cannot open the file" \
  $(gen --model "$tmp/good" --prompt-ids-file "$tmp/nofile.npy")
printf 'not numpy' >"$tmp/bad.npy"
expect_exit2 "not a .npy file" $(gen --model "$tmp/good" --prompt-ids-file "$tmp/bad.npy")
# Headers that end inside a value, and a shape whose size would overflow (found by fuzzing).
printf "\x93NUMPY\x01\x00\x0c\x00{'descr': '<" >"$tmp/cut.npy"
expect_exit2 "cut.npy: .npy header's 'descr' is not" $(gen --model "$tmp/good" --prompt-ids-file "$tmp/cut.npy")
printf "\x93NUMPY\x01\x00\x4b\x00{'descr': '<i8', 'fortran_order': False, 'shape': (2305843009213693953,), }\x01\x00\x00\x00\x00\x00\x00\x00" >"$tmp/huge.npy"
expect_exit2 "huge.npy: holds fewer than the 2305843009213693953 elements" \
  $(gen --model "$tmp/good" --prompt-ids-file "$tmp/huge.npy")
long=1,2,3,4,5,6,7,8,9,10,11
expect_exit2 "need 13 positions, beyond max_position_embeddings 12.*--allow-long-context" \
  $(gen --model "$tmp/good" --prompt-ids $long,12 --max-new-tokens 2)
err=$("$bin" $(gen --model "$tmp/good" --prompt-ids $long,12 --allow-long-context) 2>&1 >/dev/null)
rc=$?
[ $rc -eq 0 ] && ok || bad "--allow-long-context exited $rc: $err"
printf '%s' "$err" | grep -q "warning: 13 positions exceed max_position_embeddings 12" && ok ||
  bad "--allow-long-context does not warn: $err"

# Chat turns (--turn-ids): each a prompt of ids in the vocabulary, the positions counted.
out=$("$bin" $(gen --model "$tmp/good" --prompt-ids 1,2 --turn-ids 3 --turn-ids 4,5 --json) 2>&1)
[ "$(json_get "$out" turns 2>/dev/null)" = \
  '[{"prompt_tokens": 2, "tokens": [0, 0]}, {"prompt_tokens": 1, "tokens": [0, 0]}, {"prompt_tokens": 2, "tokens": [0, 0]}]' ] &&
  ok || bad "generate --turn-ids: $out"
expect_exit2 "^seqpar: error: --turn-ids token 16 at position 0 is outside the vocabulary" \
  $(gen --model "$tmp/good" --prompt-ids 1 --turn-ids 16)
# Packed documents (--document-ids, repeatable): prefilled together, each document's next token
# (zero weights: token 0); the packed total may pass max_position_embeddings 12, a document not.
docs() { echo generate --quiet --model "$tmp/good" "$@"; }
out=$("$bin" $(docs --document-ids 1,2,3 --document-ids 4 --document-ids 5,6 --ring-degree 2 \
               --layout zigzag --json --output "$tmp/docs.out") 2>&1); rc=$?
[ $rc -eq 0 ] && [ "$(json_get "$out" tokens 2>/dev/null)" = "[0, 0, 0]" ] &&
  [ "$(json_get "$out" document_tokens 2>/dev/null)" = "[3, 1, 2]" ] &&
  [ "$(json_get "$out" prompt_tokens 2>/dev/null)" = 6 ] && [ -s "$tmp/docs.out" ] && ok ||
  bad "generate --document-ids exited $rc: $out"
out=$("$bin" $(docs --document-ids $long --document-ids 1,2,3 --json) 2>&1); rc=$?
[ $rc -eq 0 ] && [ "$(json_get "$out" prompt_tokens 2>/dev/null)" = 14 ] && ok ||
  bad "--document-ids past 12 positions together exited $rc: $out"
expect_exit2 "^seqpar: error: --document-ids\[1\] holds 13 tokens, beyond max_position_embeddings 12.*--allow-long-context" \
  $(docs --document-ids 1 --document-ids $long,12,13)
expect_exit2 "^seqpar: error: --max-new-tokens 3 with --document-ids: .*decoding after it is not supported; valid: 1" \
  $(docs --document-ids 1,2 --max-new-tokens 3)
expect_exit2 "give one prompt (--prompt-ids or --prompt-ids-file) or packed documents" \
  $(docs --document-ids 1,2 --prompt-ids 3)
expect_exit2 "^seqpar: error: --turn-ids continue one prompt's cache" \
  $(docs --document-ids 1,2 --turn-ids 3)
expect_exit2 "^seqpar: error: --prefill-chunk splits one prompt" \
  $(docs --document-ids 1,2 --prefill-chunk 1)
expect_exit2 "^seqpar: error: --document-ids\[1\] token 16 at position 1 is outside the vocabulary" \
  $(docs --document-ids 1,2 --document-ids 3,16)
expect_exit2 "^seqpar: error: --document-ids\[0\]: an empty item" $(docs --document-ids ,1)
expect_exit2 "^seqpar: error: --document-ids holds 3 tokens in 2 documents, fewer than the 4 sequence-parallel ranks" \
  $(docs --document-ids 1,2 --document-ids 3 --ring-degree 4)
expect_exit2 "^seqpar: error: --document-ids (2 packed documents, 5 tokens) on 2 sequence-parallel ranks: --schedule 'steal' balances a single sequence" \
  $(docs --document-ids 1,2 --document-ids 3,4,5 --ring-degree 2 --schedule steal)
if [ -n "$mpiexec" ]; then
  out=$(timeout -s KILL 90 "$mpiexec" --allow-run-as-root --oversubscribe \
          --mca btl_vader_single_copy_mechanism none -n 2 \
          "$bin" $(docs --document-ids 1,2,3 --document-ids 4 --tp 2 --backend mpi --json) 2>&1)
  rc=$?
  [ $rc -eq 0 ] && [ "$(json_get "$out" tokens 2>/dev/null)" = "[0, 0]" ] && ok ||
    bad "mpi: generate --document-ids exited $rc: $out"
  err=$(timeout -s KILL 90 "$mpiexec" --allow-run-as-root --oversubscribe \
          --mca btl_vader_single_copy_mechanism none -n 2 \
          "$bin" $(docs --document-ids 1 --ring-degree 2 --backend mpi) 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] && [ "$(printf '%s\n' "$err" | grep -c "seqpar: error")" -eq 1 ] &&
    printf '%s' "$err" | grep -q "fewer than the 2 sequence-parallel ranks" && ok ||
    bad "mpi: --document-ids shorter than the ranks: exit $rc: $err"
fi
# seqpar model --seq-lens: the llm presets' packed documents (seeded), --verify comparing each
# with that document alone on one rank.
out=$("$bin" model --preset tiny-llm --seq-lens 30,1,7,12 --tp 2 --ring-degree 2 --layout zigzag \
        --verify --json 2>&1); rc=$?
[ $rc -eq 0 ] && [ "$(json_get "$out" ok 2>/dev/null)" = True ] &&
  [ "$(json_get "$out" seq_lens 2>/dev/null)" = "[30, 1, 7, 12]" ] && ok ||
  bad "model --seq-lens --verify exited $rc: $out"
expect_exit2 "^seqpar: error: --seq-lens length 0 is out of range" model --preset tiny-llm --seq-lens 3,0
expect_exit2 "^seqpar: error: --seq-lens prefill packed documents in one pass and decode nothing" \
  model --preset tiny-llm --seq-lens 3,4 --decode 2
expect_exit2 "^seqpar: error: --seq-lens (packed documents) is for llm presets" \
  model --preset tiny-dit --seq-lens 3
expect_exit2 "^seqpar: error: --seq-lens holds 3 tokens in 2 documents, fewer than the 4 sequence-parallel ranks" \
  model --preset tiny-llm --seq-lens 1,2 --ring-degree 4
if [ -n "$mpiexec" ]; then
  out=$(timeout -s KILL 90 "$mpiexec" --allow-run-as-root --oversubscribe \
          --mca btl_vader_single_copy_mechanism none -n 4 \
          "$bin" model --preset tiny-llm --seq-lens 30,1,7,12 --tp 2 --ulysses-degree 2 --verify \
          --backend mpi --json 2>&1); rc=$?
  [ $rc -eq 0 ] && printf '%s' "$out" | grep -q '"ok":true' && ok ||
    bad "mpi: model --seq-lens --verify exited $rc: $out"
fi
# Lists of ids: a comma sits between two ids.
expect_exit2 "--prompt-ids: an empty item between two commas" $(gen --model "$tmp/good" --prompt-ids 1,,2)
expect_exit2 "--prompt-ids: a comma ends the list" $(gen --model "$tmp/good" --prompt-ids 1,2,)
expect_exit2 "--prompt-ids: an empty item before the first comma" $(gen --model "$tmp/good" --prompt-ids ,1)
expect_exit2 "--chunk-strategy 'bogus' is unknown" \
  $(gen --model "$tmp/good" --prompt-ids 1,2 --prefill-chunk 1 --chunk-strategy bogus)
expect_exit2 "--chunk-schedule 'bogus' is unknown" \
  $(gen --model "$tmp/good" --prompt-ids 1,2 --prefill-chunk 1 --chunk-schedule bogus)
# A key twice in one object (JSON parsers keep the last silently): refused, in config.json, in
# the index, and in a --parallel-config file.
make_ckpt "$tmp/dupkey" 1 2
sed -i 's/"hidden_size": 8/"hidden_size": 8, "hidden_size": 16/' "$tmp/dupkey/config.json"
expect_exit2 "dupkey/config.json: the key 'hidden_size' appears twice in one object" \
  $(gen --model "$tmp/dupkey" --prompt-ids 1)
make_ckpt "$tmp/dupindex" 1 2
python3 - "$tmp/dupindex/model.safetensors.index.json" <<'PY'
import json, sys
p = sys.argv[1]
j = json.load(open(p))
name, shard = next(iter(j["weight_map"].items()))
other = next(s for s in j["weight_map"].values() if s != shard)
text = json.dumps(j).replace('"weight_map": {', '"weight_map": {"%s": "%s", ' % (name, other), 1)
open(p, "w").write(text)
PY
expect_exit2 "model.safetensors.index.json: the key '.*' appears twice in one object (inside 'weight_map')" \
  $(gen --model "$tmp/dupindex" --prompt-ids 1)
printf '{"parallel_config": {"ulysses_degree": 2, "ulysses_degree": 1}}' >"$tmp/dup_pc.json"
expect_exit2 "dup_pc.json: the key 'ulysses_degree' appears twice in one object (inside 'parallel_config')" \
  $(gen --model "$tmp/good" --prompt-ids 1 --parallel-config "$tmp/dup_pc.json")

# A causal LM has no guidance branches: cfg_parallel_size 2 from a parallel config is refused.
printf '{"parallel_config": {"cfg_parallel_size": 2}}' >"$tmp/cfg2.json"
expect_exit2 "cfg2.json: cfg_parallel_size 2 runs a diffusion model's two guidance branches" \
  $(gen --model "$tmp/good" --prompt-ids 1 --parallel-config "$tmp/cfg2.json")

# Each tensor in one shard, where the index says: a copy in a second shard, or a tensor the index
# does not list, is refused (it would be ignored without a word).
# add_tensor FROM TO NAME: appends tensor NAME (from safetensors FROM, or a new [2] one) to TO.
add_tensor() {
  python3 - "$@" <<'PY'
import json, struct, sys
src, dst, name = sys.argv[1:4]
def read(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]
h, data = read(dst)
if src != "-":
    sh, sdata = read(src)
    e = sh[name]
    blob = sdata[e["data_offsets"][0]:e["data_offsets"][1]]
    entry = {"dtype": e["dtype"], "shape": e["shape"]}
else:
    blob, entry = bytes(8), {"dtype": "F32", "shape": [2]}
entry["data_offsets"] = [len(data), len(data) + len(blob)]
h[name] = entry
t = json.dumps(h).encode()
t += b" " * (-len(t) % 8)
open(dst, "wb").write(struct.pack("<Q", len(t)) + t + data + blob)
PY
}
make_ckpt "$tmp/twice" 1 2
add_tensor "$tmp/twice/model-00001-of-00002.safetensors" "$tmp/twice/model-00002-of-00002.safetensors" \
  model.embed_tokens.weight
expect_exit2 "model-00002-of-00002.safetensors: holds tensor 'model.embed_tokens.weight' too, which .*index.json places in .*model-00001-of-00002.safetensors" \
  $(gen --model "$tmp/twice" --prompt-ids 1)
make_ckpt "$tmp/unlisted" 1 2
add_tensor - "$tmp/unlisted/model-00002-of-00002.safetensors" extra.weight
expect_exit2 "holds tensor 'extra.weight', which .*index.json does not list" \
  $(gen --model "$tmp/unlisted" --prompt-ids 1)

# A config's keys are named as config.json spells them (not as flags).
make_ckpt "$tmp/head_dim0" 1 1 '{"head_dim": 0}'
expect_exit2 "head_dim0/config.json: head_dim 0 is out of range; valid: 2 to" \
  $(gen --model "$tmp/head_dim0" --prompt-ids 1)
expect_exit2 "'x' is not a token id" $(gen --model "$tmp/good" --prompt-ids 1 --turn-ids 2,x)
expect_exit2 "2 turns and their tokens need 13 positions, beyond max_position_embeddings 12" \
  $(gen --model "$tmp/good" --prompt-ids 1,2,3 --turn-ids 4,5,6 --turn-ids 7,8)
expect_exit2 "--chunk-strategy ring is not one over a cache; valid: passkv, passq" \
  $(gen --model "$tmp/good" --prompt-ids 1 --prefill-chunk 2 --chunk-strategy ring)

# Mesh and flags.
expect_exit2 "--tp 3 must divide num_attention_heads 2" $(gen --model "$tmp/good" --prompt-ids 1 --tp 3)
expect_exit2 "--max-new-tokens 0 is out of range" $(gen --model "$tmp/good" --prompt-ids 1 --max-new-tokens 0)
out=$("$bin" $(gen --model "$tmp/empty2" --prompt-ids 1 --json) 2>/dev/null); rc=$?
[ $rc -eq 2 ] && [ "$(json_get "$out" exit_code)" = 2 ] && ok || bad "--json error object: $rc $out"

# Outputs never destroy inputs (core/files.h): an --output that is, by any path, a file the run
# reads is refused (exit 2, one line naming both) before anything is written; the inputs stay
# byte for byte; a refused or killed run leaves no file under the output's name, nor a temporary.
digest() { cat "$@" | sha256sum; }
inputs_before=$(digest "$tmp"/good/* "$tmp"/sharded/*)
printf '1,2,3\n' >"$tmp/prompt.txt"
printf '{"ring_degree": 1}\n' >"$tmp/pc.json"
ln -sf "$tmp/good/model.safetensors" "$tmp/link.safetensors"
ln -f "$tmp/good/model.safetensors" "$tmp/hard.safetensors"
for out in "$tmp/good/model.safetensors" "$tmp/good/../good/./model.safetensors" \
           "$tmp/link.safetensors" "$tmp/hard.safetensors" "$tmp/good/config.json"; do
  expect_exit2 "--output '$out' is the input '.*' of this run; write the output to another file" \
    $(gen --model "$tmp/good" --prompt-ids 1,2,3 --output "$out")
done
for out in "$tmp/sharded/model-00002-of-00003.safetensors" \
           "$tmp/sharded/model.safetensors.index.json"; do
  expect_exit2 "is the input" $(gen --model "$tmp/sharded" --prompt-ids 1,2,3 --output "$out")
done
expect_exit2 "--output '$tmp/prompt.txt' is the input" \
  $(gen --model "$tmp/good" --prompt-ids-file "$tmp/prompt.txt" --output "$tmp/prompt.txt")
expect_exit2 "--output '$tmp/pc.json' is the input" \
  $(gen --model "$tmp/good" --prompt-ids 1 --parallel-config "$tmp/pc.json" --output "$tmp/pc.json")
[ "$(digest "$tmp"/good/* "$tmp"/sharded/*)" = "$inputs_before" ] && ok ||
  bad "an input changed under a refused --output"
[ "$(cat "$tmp/prompt.txt")" = "1,2,3" ] && [ "$(cat "$tmp/pc.json")" = '{"ring_degree": 1}' ] &&
  ok || bad "the prompt or config file changed"
# A refused run leaves nothing; an existing output is untouched by a refused run, replaced by a
# good one; a folder that does not exist is refused before the work (exit 1).
expect_exit2 "no tensor" $(gen --model "$tmp/layer" --prompt-ids 1 --output "$tmp/refused.out")
[ ! -e "$tmp/refused.out" ] && ok || bad "a refused run left $tmp/refused.out"
printf 'keep' >"$tmp/old.out"
expect_exit2 "no tensor" $(gen --model "$tmp/layer" --prompt-ids 1 --output "$tmp/old.out")
[ "$(cat "$tmp/old.out")" = keep ] && ok || bad "a refused run changed an existing output"
"$bin" $(gen --model "$tmp/good" --prompt-ids 1 --output "$tmp/old.out") >/dev/null 2>&1 &&
  [ "$(head -c 8 "$tmp/old.out" | od -An -tx1)" != "$(printf keep | od -An -tx1)" ] && ok ||
  bad "a good run did not replace the output"
err=$("$bin" $(gen --model "$tmp/good" --prompt-ids 1 --output "$tmp/nodir/x.out") 2>&1); rc=$?
[ $rc -eq 1 ] && printf '%s' "$err" | grep -q "the folder '$tmp/nodir' does not exist" && ok ||
  bad "--output in a missing folder: exit $rc: $err"
mkdir -p "$tmp/killed"
"$bin" generate --model "$tmp/good" --prompt-ids 1 --max-new-tokens 1000000 --allow-long-context \
  --output "$tmp/killed/out.safetensors" >/dev/null 2>"$tmp/killed.err" &
pid=$!
# Killed while it decodes (its prefill reported), with its output open if it opened it early.
wait_for_line "$tmp/killed.err" "^seqpar generate: prefill of" $pid && ok ||
  bad "the run to kill reported no prefill: $(head -3 "$tmp/killed.err")"
kill -KILL $pid 2>/dev/null; wait $pid 2>/dev/null
[ -z "$(ls -A "$tmp/killed")" ] && ok || bad "a killed run left: $(ls -A "$tmp/killed")"

# Finite weights that overflow fp32 at run time (down_proj of 3e38 over activations of ~60): exit
# 1 with one line naming the module where the first Inf appeared, not NaN logits with exit 0;
# also with the sequence and the weights split over ranks.
make_ckpt "$tmp/overflow" 2 1 '{}' '{"down_proj.weight": 3e38, "*": 1.0}'
for mesh in "" "--ring-degree 2" "--tp 2 --ulysses-degree 2"; do
  rm -f "$tmp/overflow.out"
  err=$("$bin" $(gen --model "$tmp/overflow" --prompt-ids 1,2,3,4 --output "$tmp/overflow.out") \
        $mesh 2>&1 >/dev/null); rc=$?
  [ $rc -eq 1 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] &&
    printf '%s' "$err" | grep -q "layers.0.mlp produced a non-finite value (inf)" &&
    [ ! -e "$tmp/overflow.out" ] && ok || bad "down_proj of 3e38 ($mesh): exit $rc: $err"
done
# Activations that stay finite (every other weight 0.001) but whose squares overflow in the next
# norm: a norm would scale them to zeros and the run would end with exit 0 on zeros; it names
# the norm instead.
make_ckpt "$tmp/overflow_norm" 2 1 '{}' '{"down_proj.weight": 3e38, "*": 0.001}'
for mesh in "" "--tp 2"; do
  err=$("$bin" $(gen --model "$tmp/overflow_norm" --prompt-ids 1,2,3,4) $mesh 2>&1 >/dev/null)
  rc=$?
  [ $rc -eq 1 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] &&
    printf '%s' "$err" | grep -q "layers.1.input_layernorm produced a non-finite value (nan)" \
    && ok || bad "finite activations overflowing a norm ($mesh): exit $rc: $err"
done

# A checkpoint larger than the machine (829 GB of bf16 weights in a sparse file: hidden 32768,
# intermediate 4194304) is refused from its headers before a weight is read: exit 2,
# naming the need per rank and what is available, also when tp splits it over ranks.
python3 - "$tmp/huge" <<'PY'
import json, os, struct, sys
d = sys.argv[1]
os.makedirs(d)
H, F, V, NH, KV = 32768, 1 << 22, 16, 256, 8
json.dump(dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=H,
               intermediate_size=F, num_hidden_layers=1, num_attention_heads=NH,
               num_key_value_heads=KV, vocab_size=V, max_position_embeddings=64,
               rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True),
          open(os.path.join(d, "config.json"), "w"))
p, kv = "model.layers.0.", KV * (H // NH)
t = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H],
     p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
     p + "self_attn.q_proj.weight": [H, H], p + "self_attn.k_proj.weight": [kv, H],
     p + "self_attn.v_proj.weight": [kv, H], p + "self_attn.o_proj.weight": [H, H],
     p + "mlp.gate_proj.weight": [F, H], p + "mlp.up_proj.weight": [F, H],
     p + "mlp.down_proj.weight": [H, F]}
header, off = {}, 0
for n in sorted(t):
    size = 2 * t[n][0] * (t[n][1] if len(t[n]) > 1 else 1)
    header[n] = {"dtype": "BF16", "shape": t[n], "data_offsets": [off, off + size]}
    off += size
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(d, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    f.truncate(8 + len(h) + off)
PY
for mesh in "" "--tp 4"; do
  err=$("$bin" $(gen --model "$tmp/huge" --prompt-ids 1,2) $mesh 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] &&
    printf '%s' "$err" | grep -q "generate with $tmp/huge (829 GB of weights.* needs about .* of memory (.* on this machine, .* each) but this machine has .* available (MemAvailable)" &&
    ok || bad "a checkpoint of 829 GB ($mesh): exit $rc: $err"
done
if [ -n "$mpiexec" ]; then
  err=$(timeout -s KILL 90 "$mpiexec" --allow-run-as-root --oversubscribe \
          --mca btl_vader_single_copy_mechanism none -n 2 \
          "$bin" $(gen --model "$tmp/huge" --prompt-ids 1,2 --tp 2 --backend mpi) 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] && [ "$(printf '%s\n' "$err" | grep -c "2 ranks on this machine, 415 GB each")" -eq 1 ] &&
    ok || bad "mpi: a checkpoint of 829 GB: exit $rc: $err"
fi

# A prompt shorter than the sequence-parallel ranks: one line before any rank runs, exit 2 on
# both backends.
expect_exit2 "--prompt-ids holds 2 tokens, fewer than the 4 sequence-parallel ranks" \
  $(gen --model "$tmp/good" --prompt-ids 1,2 --ring-degree 4)
expect_exit2 "--prompt-ids holds 3 tokens, fewer than the 4 sequence-parallel ranks" \
  $(gen --model "$tmp/good" --prompt-ids 1,2,3 --ring-degree 2 --ulysses-degree 2 --prefill-chunk 1)
if [ -n "$mpiexec" ]; then
  err=$(timeout -s KILL 90 "$mpiexec" --allow-run-as-root --oversubscribe \
          --mca btl_vader_single_copy_mechanism none -n 4 \
          "$bin" $(gen --model "$tmp/good" --prompt-ids 1,2 --ring-degree 4 --backend mpi) 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] && [ "$(printf '%s\n' "$err" | grep -c "fewer than the 4 sequence-parallel ranks")" -eq 1 ] &&
    ok || bad "mpi: a prompt shorter than the ranks: exit $rc: $err"
fi

# Under MPI a weight refused on one tp rank only (a NaN in the last column of down_proj: rank 1's
# share) is reported by that rank alone, exit 2 as on threads; the rank that only heard of it
# stays quiet.
if [ -n "$mpiexec" ]; then
  make_ckpt "$tmp/nan_col" 1 1 '{}' '{"*": 0.5}'
  python3 - "$tmp/nan_col/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
e = json.loads(b[8:8 + n])["model.layers.0.mlp.down_proj.weight"]  # [8, 16]
at = 8 + n + e["data_offsets"][0] + 4 * (16 - 1)  # row 0, column 15
b[at:at + 4] = struct.pack("<f", float("nan"))
open(p, "wb").write(bytes(b))
PY
  err=$(timeout -s KILL 90 "$mpiexec" --allow-run-as-root --oversubscribe \
          --mca btl_vader_single_copy_mechanism none -n 2 \
          "$bin" $(gen --model "$tmp/nan_col" --prompt-ids 1,2 --tp 2 --backend mpi) 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] && [ "$(printf '%s\n' "$err" | grep -c "seqpar: error")" -eq 1 ] &&
    printf '%s' "$err" | grep -q "rank 1: .*tensor 'model.layers.0.mlp.down_proj.weight' holds a non-finite value" &&
    ok || bad "mpi: a NaN in rank 1's share: exit $rc: $err"
fi

# Under MPI a weight every rank refuses alike (a NaN in the replicated final norm) is reported
# once, exit 2: the others see the same failure from a lower rank, or hear of the first one's
# failure while they wait for it, and stay quiet. Which rank names it depends on which one got
# there first.
if [ -n "$mpiexec" ]; then
  make_ckpt "$tmp/nan_norm" 1 1 '{}' '{"*": 0.5}'
  python3 - "$tmp/nan_norm/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
e = json.loads(b[8:8 + n])["model.norm.weight"]
at = 8 + n + e["data_offsets"][0]
b[at:at + 4] = struct.pack("<f", float("nan"))
open(p, "wb").write(bytes(b))
PY
  err=$(timeout -s KILL 90 "$mpiexec" --allow-run-as-root --oversubscribe \
          --mca btl_vader_single_copy_mechanism none -n 4 \
          "$bin" $(gen --model "$tmp/nan_norm" --prompt-ids 1,2,3,4 --tp 2 --ring-degree 2 \
                   --backend mpi) 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] && [ "$(printf '%s\n' "$err" | grep -c "seqpar: error")" -eq 1 ] &&
    printf '%s' "$err" | grep -q "rank [0-3]: .*tensor 'model.norm.weight' holds a non-finite value" &&
    ok || bad "mpi: a NaN every rank reads: exit $rc: $err"
fi

# Under MPI a rank stopped (SIGSTOP) in the middle of decoding is named by the rank that waits
# for it in the model's sub-group collectives (tp's all_reduce, ring's all_to_allv), within the
# deadline (SEQPAR_TIMEOUT_S=2).
if [ -n "$mpiexec" ]; then
  for mesh in "--tp 2" "--ring-degree 2"; do
    SEQPAR_TIMEOUT_S=2 timeout -s KILL 90 "$mpiexec" --allow-run-as-root --oversubscribe \
      --mca btl_vader_single_copy_mechanism none -x SEQPAR_TIMEOUT_S -n 2 \
      "$bin" generate --model "$tmp/good" --prompt-ids 1,2 --max-new-tokens 1000000 \
      --allow-long-context --backend mpi $mesh >/dev/null 2>"$tmp/stall.err" &
    launcher=$!
    victim=$(mpi_rank_pid $launcher 1)
    # Rank 0 reports the prefill (its progress on stderr) once both ranks have passed MPI_Init,
    # the load and the prompt's collectives: they are in the decode loop.
    wait_for_line "$tmp/stall.err" "^seqpar generate: prefill of" $launcher ||
      bad "mpi $mesh: no prefill reported: $(head -3 "$tmp/stall.err")"
    [ -n "$victim" ] && kill -STOP "$victim"
    wait $launcher; rc=$?
    [ -n "$victim" ] && { kill -CONT "$victim"; kill -KILL "$victim"; } 2>/dev/null
    [ $rc -ne 0 ] && grep -q "waiting for .*which world rank 1 did not reach" "$tmp/stall.err" &&
      ok || bad "mpi $mesh: a stopped rank is not named: exit $rc: $(grep seqpar "$tmp/stall.err")"
  done
fi

# Under MPI every rank meets the error; one line is printed.
if [ -n "$mpiexec" ]; then
  err=$(timeout -s KILL 90 "$mpiexec" --allow-run-as-root --oversubscribe \
          --mca btl_vader_single_copy_mechanism none -n 2 \
          "$bin" $(gen --model "$tmp/layer" --prompt-ids 1 --ring-degree 2 --backend mpi) \
          2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] && ok || bad "mpi: exited $rc, want 2: $err"
  [ "$(printf '%s\n' "$err" | grep -c "no tensor 'model.layers.1.input_layernorm.weight'")" -eq 1 ] &&
    ok || bad "mpi: error not printed once: $err"
fi

# Under MPI an --output refused on rank 0 (an input of the run, a folder that does not exist, a
# full disk) ends every rank at once: one line, the threads' exit code, well within the deadline
# (rank 1 used to wait in a collective for rank 0, which had left, until SEQPAR_TIMEOUT_S).
if [ -n "$mpiexec" ]; then
  good_before=$(digest "$tmp"/good/*)
  while IFS='|' read -r code out text; do
    [ -z "$code" ] && continue
    err=$(SEQPAR_TIMEOUT_S=30 timeout -s KILL 90 "$mpiexec" --allow-run-as-root --oversubscribe \
            --mca btl_vader_single_copy_mechanism none -x SEQPAR_TIMEOUT_S -n 2 \
            "$bin" $(gen --model "$tmp/good" --prompt-ids 1,2 --tp 2 --backend mpi --output "$out") \
            2>&1 >/dev/null </dev/null); rc=$?
    err=$(printf '%s\n' "$err" | grep seqpar)
    [ $rc -eq "$code" ] && [ "$err" = "seqpar: error: $text" ] &&
      ok || bad "mpi --output $out: exit $rc: $err"
  done <<TABLE
2|$tmp/good/config.json|--output '$tmp/good/config.json' is the input '$tmp/good/config.json' of this run; write the output to another file
2|$tmp/good/model.safetensors|--output '$tmp/good/model.safetensors' is the input '$tmp/good/model.safetensors' of this run; write the output to another file
1|$tmp/nodir/x.out|--output '$tmp/nodir/x.out': the folder '$tmp/nodir' does not exist
1|/dev/full|--output '/dev/full': cannot write the file (No space left on device)
TABLE
  [ "$(digest "$tmp"/good/*)" = "$good_before" ] && ok || bad "mpi: an input changed under a refused --output"
  err=$(timeout -s KILL 90 "$mpiexec" --allow-run-as-root --oversubscribe \
          --mca btl_vader_single_copy_mechanism none -n 2 \
          "$bin" $(gen --model "$tmp/good" --prompt-ids 1,2 --tp 2 --backend mpi --output "$tmp/mpi.out") \
          2>&1 >/dev/null); rc=$?
  [ $rc -eq 0 ] && [ -s "$tmp/mpi.out" ] && ok || bad "mpi --output: exit $rc: $err"
fi

echo "cli generate: $pass passed, $fail failed"
[ $fail -eq 0 ]
