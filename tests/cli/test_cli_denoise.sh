#!/usr/bin/env bash
# seqpar denoise: a tiny Wan checkpoint in the original layout and inputs, written here with the
# standard library's python3; the run's JSON and output tensor, and bad inputs refused with exit 2
# and one line naming the tensor or key and what was expected (both backends).
# usage: test_cli_denoise.sh path/to/seqpar [path/to/mpiexec]
set -u
bin=${1:?usage: test_cli_denoise.sh path/to/seqpar [mpiexec]}
mpiexec=${2:-}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# write.py DIR: DIR/wan (dim 12, 2 heads, 1 layer, 4 channels, text width 8) and input files.
cat > "$tmp/write.py" <<'EOF'
import json, os, struct, sys
d = sys.argv[1]
seed = [12345]
def rnd(n, scale):
    out = []
    for _ in range(n):
        seed[0] = (seed[0] * 1103515245 + 12345) % 2**31
        out.append((seed[0] / 2**31 - 0.5) * scale)
    return out
def save(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        shape, vals, dtype = (*tensors[name], "F32")[:3]
        b = struct.pack(f"<{len(vals)}" + {"F32": "f", "I64": "q", "U8": "B"}[dtype], *vals)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b); off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
def t(shape, scale=0.3, fill=None):
    n = 1
    for s in shape: n *= s
    return (shape, [fill] * n if fill is not None else rnd(n, scale))
D, C, T, FQ, FF = 12, 4, 8, 4, 16
w = {"patch_embedding.weight": t([D, C, 1, 2, 2]), "patch_embedding.bias": t([D]),
     "text_embedding.0.weight": t([D, T]), "text_embedding.0.bias": t([D]),
     "text_embedding.2.weight": t([D, D]), "text_embedding.2.bias": t([D]),
     "time_embedding.0.weight": t([D, FQ]), "time_embedding.0.bias": t([D]),
     "time_embedding.2.weight": t([D, D]), "time_embedding.2.bias": t([D]),
     "time_projection.1.weight": t([6 * D, D]), "time_projection.1.bias": t([6 * D]),
     "blocks.0.modulation": t([1, 6, D]), "blocks.0.norm3.weight": t([D], fill=1.0),
     "blocks.0.norm3.bias": t([D]), "blocks.0.ffn.0.weight": t([FF, D]),
     "blocks.0.ffn.0.bias": t([FF]), "blocks.0.ffn.2.weight": t([D, FF]),
     "blocks.0.ffn.2.bias": t([D]), "head.modulation": t([1, 2, D]),
     "head.head.weight": t([4 * C, D]), "head.head.bias": t([4 * C])}
for a in ("self_attn", "cross_attn"):
    for p in "qkvo":
        w[f"blocks.0.{a}.{p}.weight"] = t([D, D]); w[f"blocks.0.{a}.{p}.bias"] = t([D])
    w[f"blocks.0.{a}.norm_q.weight"] = t([D], fill=1.0)
    w[f"blocks.0.{a}.norm_k.weight"] = t([D], fill=1.0)
os.makedirs(f"{d}/wan")
save(f"{d}/wan/diffusion_pytorch_model.safetensors", w)
cfg = {"model_type": "t2v", "dim": D, "ffn_dim": FF, "freq_dim": FQ, "in_dim": C, "out_dim": C,
       "num_heads": 2, "num_layers": 1, "text_len": 512, "text_dim": T, "eps": 1e-6}
json.dump(cfg, open(f"{d}/wan/config.json", "w"))
os.makedirs(f"{d}/wan_ones")  # a patch embedding of ones: 16 latents of 3e38 sum past fp32
save(f"{d}/wan_ones/diffusion_pytorch_model.safetensors",
     {**w, "patch_embedding.weight": t([D, C, 1, 2, 2], fill=1.0)})
json.dump(cfg, open(f"{d}/wan_ones/config.json", "w"))
lat, txt, neg = t([1, C, 2, 6, 10], 2.0), t([1, 5, T], 2.0), t([1, 3, T], 2.0)
save(f"{d}/in.safetensors", {"latents": lat, "encoder_hidden_states": txt,
                             "negative_encoder_hidden_states": neg,
                             "timestep": ([1], [500.0])})
# diffusers' pipelines pass integer timesteps
save(f"{d}/int_timestep.safetensors", {"latents": lat, "encoder_hidden_states": txt,
                                       "negative_encoder_hidden_states": neg,
                                       "timestep": ([1], [500], "I64")})
save(f"{d}/byte_timestep.safetensors", {"latents": lat, "encoder_hidden_states": txt,
                                        "timestep": ([1], [50], "U8")})
save(f"{d}/odd_grid.safetensors", {"latents": t([1, C, 2, 5, 10]), "encoder_hidden_states": txt,
                                   "timestep": ([1], [500.0])})
save(f"{d}/wide_text.safetensors", {"latents": lat, "encoder_hidden_states": t([1, 5, T + 1]),
                                    "timestep": ([1], [500.0])})
save(f"{d}/no_timestep.safetensors", {"latents": lat, "encoder_hidden_states": txt})
save(f"{d}/misnamed.safetensors", {"latents": lat, "encoder_hidden_states": txt,
                                   "timestep": ([1], [500.0]), "negative_prompt_embeds": txt})
save(f"{d}/newline_name.safetensors", {"latents": lat, "encoder_hidden_states": txt,
                                       "timestep": ([1], [500.0]), "a\nb": txt})
save(f"{d}/scalar.safetensors", {"latents": ([], [1.0]), "encoder_hidden_states": txt,
                                 "timestep": ([1], [500.0])})
save(f"{d}/huge.safetensors", {"latents": t([1, C, 2, 6, 10], fill=3e38),
                               "encoder_hidden_states": txt, "timestep": ([1], [500.0])})
save(f"{d}/channels.safetensors", {"latents": t([1, C + 1, 2, 6, 10]),
                                   "encoder_hidden_states": txt, "timestep": ([1], [500.0])})
# Latents of 68.7 GB in a sparse file: the header is real, the data never written.
h = json.dumps({"latents": {"dtype": "F32", "shape": [1, C, 16, 16384, 16384],
                            "data_offsets": [0, 4 * C * 16 * 16384 * 16384]}}).encode()
h += b" " * (-len(h) % 8)
with open(f"{d}/huge_latents.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    f.truncate(8 + len(h) + 4 * C * 16 * 16384 * 16384)
os.makedirs(f"{d}/bad_config")
json.dump({k: v for k, v in cfg.items() if k != "num_heads"},
          open(f"{d}/bad_config/config.json", "w"))
os.makedirs(f"{d}/bad_shape")
w["head.head.weight"] = t([4 * C, D - 1])
save(f"{d}/bad_shape/diffusion_pytorch_model.safetensors", w)
json.dump(cfg, open(f"{d}/bad_shape/config.json", "w"))
os.makedirs(f"{d}/neither")
EOF
python3 "$tmp/write.py" "$tmp" || { echo "cannot write the test checkpoint"; exit 1; }
m="--model $tmp/wan --output $tmp/out.safetensors"

# A run: one call (guided: the negative states are given), and a 3-step loop on 2 x 2 ranks.
out=$("$bin" denoise $m --inputs "$tmp/in.safetensors" --json 2>/dev/null); rc=$?
[ $rc -eq 0 ] && ok || bad "denoise one call exited $rc"
[ "$(json_get "$out" output_tensor)" = "noise_pred" ] && ok || bad "one call: $out"
[ "$(json_get "$out" checkpoint_layout)" = "original" ] && ok || bad "layout: $out"
err=$("$bin" denoise $m --inputs "$tmp/in.safetensors" --steps 3 --shift 3 --ring-degree 2 \
      --ulysses-degree 2 --json 2>&1 >"$tmp/loop.json"); rc=$?
[ $rc -eq 0 ] && ok || bad "denoise --steps 3 exited $rc: $err"
[ "$(json_get "$(cat "$tmp/loop.json")" step_seconds | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" = 3 ] \
  && ok || bad "--steps 3: $(cat "$tmp/loop.json")"
printf '%s' "$err" | grep -q "step 3/3" && ok || bad "no progress line on stderr: $err"
# An int64 timestep gives what the same value in fp32 gives (seeded above: the same tensors).
"$bin" denoise $m --inputs "$tmp/in.safetensors" >/dev/null 2>&1 \
  && cp "$tmp/out.safetensors" "$tmp/out_f32.safetensors" \
  && "$bin" denoise $m --inputs "$tmp/int_timestep.safetensors" >/dev/null 2>&1 \
  && cmp -s "$tmp/out.safetensors" "$tmp/out_f32.safetensors" \
  && ok || bad "an I64 timestep 500 did not give the F32 timestep's output"
# Tensor parallel ranks read their share of the weights: less than one rank reading them all.
one=$(json_get "$out" weight_bytes_per_rank | python3 -c 'import json,sys; print(json.load(sys.stdin)[0])')
tp2=$("$bin" denoise $m --inputs "$tmp/in.safetensors" --tp 2 --json 2>/dev/null)
python3 -c 'import json,sys; w=json.loads(sys.argv[1])["weight_bytes_per_rank"]; sys.exit(not (len(w) == 2 and max(w) < 0.8 * int(sys.argv[2])))' "$tp2" "$one" \
  && ok || bad "--tp 2: weight bytes per rank not below one rank's $one: $tp2"
"$bin" denoise $m --inputs "$tmp/in.safetensors" --trace "$tmp/trace.json" >/dev/null 2>&1 \
  && python3 -c 'import json,sys; json.load(open(sys.argv[1]))["traceEvents"]' "$tmp/trace.json" \
  && ok || bad "--trace did not write a trace"

# Bad inputs: exit 2, one line naming the tensor or key and what was expected.
expect_exit2 "tensor 'latents' has shape \[1, 4, 2, 5, 10\]; expected F, H, W multiples of the patch 1x2x2" \
  denoise $m --inputs "$tmp/odd_grid.safetensors"
expect_exit2 "tensor 'latents' has shape \[1, 5, 2, 6, 10\]; expected \[B, 4, F, H, W\]" \
  denoise $m --inputs "$tmp/channels.safetensors"
expect_exit2 "tensor 'encoder_hidden_states' has shape \[1, 5, 9\]; expected \[1, L, 8\]" \
  denoise $m --inputs "$tmp/wide_text.safetensors"
expect_exit2 "tensor 'latents' has shape \[\]; expected \[B, 4, F, H, W\]" \
  denoise $m --inputs "$tmp/scalar.safetensors"
expect_exit2 "tensor 'timestep' has dtype U8; expected F32, BF16, F16, F64, I64 or I32" \
  denoise $m --inputs "$tmp/byte_timestep.safetensors"
expect_exit2 "tensor 'timestep' is missing; expected \[1\]" \
  denoise $m --inputs "$tmp/no_timestep.safetensors"
expect_exit2 "tensor 'negative_prompt_embeds' is not an input of Wan; valid: latents, timestep" \
  denoise $m --inputs "$tmp/misnamed.safetensors"
expect_exit2 "tensor 'a?b' is not an input of Wan" denoise $m --inputs "$tmp/newline_name.safetensors"
expect_exit2 "tensor 'negative_encoder_hidden_states' is missing" \
  denoise $m --inputs "$tmp/no_timestep.safetensors" --steps 2 --guidance 5
expect_exit2 "neither a diffusers Wan checkpoint" \
  denoise --model "$tmp/neither" --inputs "$tmp/in.safetensors" --output "$tmp/o.safetensors"
expect_exit2 "config.json: key 'num_heads' is missing; expected an integer" \
  denoise --model "$tmp/bad_config" --inputs "$tmp/in.safetensors" --output "$tmp/o.safetensors"
# A key of the wrong JSON type, and an integer past int64: the key and its value as written.
mkdir -p "$tmp/typed_config" "$tmp/huge_config"
printf '{"_class_name": "WanTransformer3DModel", "qk_norm": 5}' >"$tmp/typed_config/config.json"
printf '{"_class_name": "WanTransformer3DModel", "num_layers": 18446744073709551615}' \
  >"$tmp/huge_config/config.json"
expect_exit2 "config.json: key 'qk_norm' is 5; expected a string" \
  denoise --model "$tmp/typed_config" --inputs "$tmp/in.safetensors" --output "$tmp/o.safetensors"
expect_exit2 "config.json: key 'num_layers' is 18446744073709551615; expected 1..1024" \
  denoise --model "$tmp/huge_config" --inputs "$tmp/in.safetensors" --output "$tmp/o.safetensors"
expect_exit2 "tensor 'head.head.weight' has shape \[16, 11\]; expected \[16, 12\]" \
  denoise --model "$tmp/bad_shape" --inputs "$tmp/in.safetensors" --output "$tmp/o.safetensors"
expect_exit2 "--tp 4 does not divide the 2 heads" denoise $m --inputs "$tmp/in.safetensors" --tp 4
expect_exit2 "--cfg 2 runs the two guidance branches side by side" \
  denoise $m --inputs "$tmp/in.safetensors" --cfg 2 --guidance 1
expect_exit2 "--model is required" denoise --inputs "$tmp/in.safetensors" --output "$tmp/o"

# Finite latents that overflow fp32 in the patch embedding (3e38 into a patch embedding of ones):
# exit 1, one line naming the module, no output written (the prediction would be all NaN).
for mesh in "" "--ring-degree 2 --ulysses-degree 2"; do
  rm -f "$tmp/huge.out"
  err=$("$bin" denoise --model "$tmp/wan_ones" --inputs "$tmp/huge.safetensors" --output "$tmp/huge.out" \
        $mesh 2>&1 >/dev/null); rc=$?
  [ $rc -eq 1 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] &&
    printf '%s' "$err" | grep -q "patch_embedding produced a non-finite value (inf)" &&
    [ ! -e "$tmp/huge.out" ] && ok || bad "latents of 3e38 ($mesh): exit $rc: $err"
done

# Inputs larger than the machine: refused from the header before a tensor is read, exit 2 with
# both numbers.
err=$("$bin" denoise $m --inputs "$tmp/huge_latents.safetensors" --ring-degree 2 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] &&
  printf '%s' "$err" | grep -q "huge_latents.safetensors (68.7 GB in fp32) needs about .* of memory (2 ranks on this machine, .* each) but this machine has .* available (MemAvailable)" &&
  ok || bad "latents of 68.7 GB: exit $rc: $err"

# Outputs never destroy inputs (core/files.h): --output or --trace naming a file the run reads is
# refused before the work (exit 2, one line naming both); the inputs stay byte for byte.
inputs_before=$(cat "$tmp"/wan/* "$tmp/in.safetensors" | sha256sum)
printf '{"ulysses_degree": 1}\n' >"$tmp/pc.json"
for out in "$tmp/wan/diffusion_pytorch_model.safetensors" "$tmp/wan/config.json" \
           "$tmp/in.safetensors" "$tmp/wan/../in.safetensors"; do
  for flag in --output --trace; do
    expect_exit2 "$flag '$out' is the input '.*' of this run" \
      denoise --model "$tmp/wan" --inputs "$tmp/in.safetensors" --output "$tmp/o2.safetensors" \
      $flag "$out"
  done
done
expect_exit2 "--output '$tmp/pc.json' is the input" denoise --model "$tmp/wan" \
  --inputs "$tmp/in.safetensors" --parallel-config "$tmp/pc.json" --output "$tmp/pc.json"
expect_exit2 "--trace '$tmp/o3' is also the file of --output" denoise --model "$tmp/wan" \
  --inputs "$tmp/in.safetensors" --output "$tmp/o3" --trace "$tmp/o3"
[ "$(cat "$tmp"/wan/* "$tmp/in.safetensors" | sha256sum)" = "$inputs_before" ] && ok ||
  bad "an input changed under a refused --output"
[ ! -e "$tmp/o2.safetensors" ] && [ ! -e "$tmp/o3" ] && ok || bad "a refused run left an output"
mkfifo "$tmp/fifo"
expect_exit2 "$tmp/fifo: is a FIFO, not a regular file; give a safetensors file" \
  denoise $m --inputs "$tmp/fifo"

if [ -n "$mpiexec" ]; then
  run_mpi() { "$mpiexec" --allow-run-as-root --oversubscribe \
                --mca btl_vader_single_copy_mechanism none "$@"; }
  out=$(run_mpi -n 2 "$bin" denoise $m --inputs "$tmp/in.safetensors" --cfg 2 --backend mpi \
        --json 2>/dev/null); rc=$?
  [ $rc -eq 0 ] && [ "$(json_get "$out" ranks)" = 2 ] && ok || bad "mpi --cfg 2 exited $rc: $out"
  err=$(run_mpi -n 2 "$bin" denoise $m --inputs "$tmp/no_timestep.safetensors" --ring-degree 2 \
        --backend mpi 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] && ok || bad "mpi missing timestep exited $rc, want 2"
  # mpiexec adds its own banner; seqpar's ranks print one line between them.
  [ "$(printf '%s\n' "$err" | grep -c '^seqpar: error:')" -eq 1 ] &&
    printf '%s' "$err" | grep -q "tensor 'timestep' is missing" \
    && ok || bad "mpi missing timestep: not one line naming the tensor: $err"
  # An output naming an input, or in a missing folder: every rank ends at once with the threads'
  # one line and exit code (rank 0 decides, before any other collective), the input unchanged.
  cp "$tmp/in.safetensors" "$tmp/in_copy.safetensors"
  for case in "$tmp/in_copy.safetensors:2:is the input" "$tmp/nope/o.safetensors:1:"; do
    IFS=: read -r target want text <<<"$case"
    err=$(SEQPAR_TIMEOUT_S=30 timeout 20 "$mpiexec" --allow-run-as-root --oversubscribe \
          --mca btl_vader_single_copy_mechanism none -n 2 "$bin" denoise $m \
          --inputs "$tmp/in_copy.safetensors" --ring-degree 2 --backend mpi --output "$target" \
          2>&1 >/dev/null); rc=$?
    [ $rc -eq "$want" ] && [ "$(printf '%s\n' "$err" | grep -c '^seqpar: error:')" -eq 1 ] &&
      ! printf '%s' "$err" | grep -q 'rank 0:' && printf '%s' "$err" | grep -q -- "$text" &&
      cmp -s "$tmp/in.safetensors" "$tmp/in_copy.safetensors" \
      && ok || bad "mpi --output $target: exit $rc (want $want): $err"
  done
fi

echo "test_cli_denoise: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
