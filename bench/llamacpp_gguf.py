#!/usr/bin/env python3
"""llamacpp_gguf: a Hugging Face Llama directory (config.json + bf16 safetensors) -> GGUF files
for llama.cpp (F32, BF16, Q8_0), for bench/compare_llamacpp.sh. Not a test, not a build step.

    llamacpp_gguf.py --model HF_DIR --out OUT_DIR [--types f32,bf16,q8_0] [--gguf-py DIR]
                                      [--check-q8]

Writes OUT_DIR/model-{f32,bf16,q8_0}.gguf with the `gguf` package (llama.cpp's gguf-py: from
--gguf-py, else an installed `gguf`). Only numpy is needed besides: the safetensors are read
directly (8-byte header length, JSON header, raw little-endian data), bf16 widened to fp32 by a
16-bit shift. What llama.cpp expects of a Llama file, and where this follows
convert_hf_to_gguf.py (conversion/llama.py, conversion/base.py in llama.cpp's tree):

- q_proj / k_proj rows are permuted per head from Hugging Face's rotate-half RoPE layout to
    ggml's adjacent-pair (RoPE "norm") layout: (heads, 2, head_dim/2, in) -> (heads, head_dim/2,
    2, in), with the KV head count for k_proj. A pure row permutation: bits unchanged.
- llama3 rope scaling is not a metadata key for llama.cpp: it reads a `rope_freqs.weight` F32
    tensor (head_dim/2 entries) that divides each inverse frequency: 1 above the high-frequency
    wavelength, `factor` below the low-frequency one, 1 / ((1 - s) / factor + s) between.
- Tied embeddings (no lm_head.weight): no `output.weight` is written; llama.cpp then uses
    `token_embd.weight` as the output projection.
- 1-D tensors (the RMSNorm weights) and rope_freqs stay F32 in every file; 2-D weights,
    token_embd included, take the file's type (as convert_hf_to_gguf.py --outtype bf16 / q8_0).
- Q8_0, as ggml's quantize_row_q8_0_ref: blocks of 32 along a row, d = max|x| / 127 (fp32),
    stored as fp16; q = roundf(x * (1/d)) (half away from zero), 1/d taken from the fp32 d.
    --check-q8 compares this file's bytes with gguf.quants.quantize on a few tensors.
- Vocabulary: tokenizer.ggml.model = "none" with llama.vocab_size, so llama.cpp loads the file
    with vocab_size dummy tokens (no tokenizer: token ids in, logits out; no EOS).
"""

import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np

QK8_0 = 32


# --- safetensors, read without torch -----------------------------------------------------------

_ST_DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}


class SafetensorsDir:
    """The tensors of a Hugging Face directory's safetensors files, as memory maps (read only)."""

    def __init__(self, model_dir):
        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        self.entries = {}  # name -> (path, dtype, shape, begin offset)
        for name in files:
            path = os.path.join(model_dir, name)
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            for key, info in header.items():
                if key == "__metadata__":
                    continue
                if info["dtype"] not in _ST_DTYPES:
                    raise SystemExit(f"llamacpp_gguf: {key}: dtype {info['dtype']} not supported")
                begin = 8 + n + info["data_offsets"][0]
                self.entries[key] = (path, info["dtype"], info["shape"], begin)

    def names(self):
        return list(self.entries)

    def raw(self, name):
        """The stored array: bf16 as uint16 bits, else its own dtype. Shape as stored."""
        path, dtype, shape, begin = self.entries[name]
        count = int(np.prod(shape)) if shape else 1
        return np.memmap(path, dtype=_ST_DTYPES[dtype], mode="r", offset=begin,
                         shape=(count,)).reshape(shape)


def to_f32(a):
    """(…) stored array -> (…) float32; bf16 bits widen exactly."""
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def to_bf16_bits(a):
    """(…) stored array -> (…) uint16 bf16 bits; bf16 passes through, others round to nearest
    even."""
    if a.dtype == np.uint16:
        return np.ascontiguousarray(a)
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


# --- Q8_0 --------------------------------------------------------------------------------------

def roundf(v):
    """C roundf (half away from zero) on float32, exact: floor(|v|) plus whether the fraction
    reaches one half (2 * frac is exact in float32)."""
    a = np.abs(v)
    fl = np.floor(a)
    return np.copysign(fl + np.floor(2 * (a - fl)), v)


def quantize_q8_0(x):
    """(rows, cols) float32, cols % 32 == 0 -> (rows, cols / 32 * 34) uint8: per block, fp16 d
    then 32 int8 q; as ggml's quantize_row_q8_0_ref."""
    rows, cols = x.shape
    if cols % QK8_0:
        raise SystemExit(f"llamacpp_gguf: Q8_0 needs a row length divisible by 32, got {cols}")
    blocks = x.reshape(rows * cols // QK8_0, QK8_0).astype(np.float32, copy=False)
    d = (np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = roundf(blocks * inv).astype(np.int8)
    out = np.empty((blocks.shape[0], 2 + QK8_0), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(rows, cols // QK8_0 * (2 + QK8_0))


# --- Llama -> GGUF -----------------------------------------------------------------------------

def permute_rope_rows(w, n_head):
    """(n_head * head_dim, …) rows, Hugging Face rotate-half order -> ggml adjacent pairs:
    [h, 2, head_dim/2, …] -> [h, head_dim/2, 2, …]."""
    shape = w.shape
    return (w.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2)
            .reshape(shape))


def llama3_rope_factors(cfg):
    """(head_dim / 2,) float32 divisors of the inverse frequencies, or None without llama3
    scaling. As convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors."""
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if str(rs.get("rope_type", rs.get("type", ""))).lower() != "llama3":
        return None
    base = rs.get("rope_theta", cfg.get("rope_theta", 10000.0))
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    factor = rs.get("factor", 8.0)
    low, high = rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old_ctx = rs.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = []
    # float32 inverse frequencies, as the convert script's torch arithmetic
    freqs = 1.0 / (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    for freq in freqs.astype(np.float32):
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf_name):
    """Hugging Face tensor name -> llama.cpp's (LLM_ARCH_LLAMA)."""
    name = hf_name[len("model."):] if hf_name.startswith("model.") else hf_name
    if name == "embed_tokens.weight":
        return "token_embd.weight"
    if name == "norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    parts = name.split(".", 2)
    if parts[0] == "layers" and parts[2] in _LAYER_NAMES:
        return f"blk.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    raise SystemExit(f"llamacpp_gguf: no llama.cpp name for {hf_name}")


def plan_tensors(st, cfg):
    """[(gguf name, hf name or None, (rows, cols) or (n,))] in the file's order: rope_freqs,
    token_embd, the blocks in order, output_norm."""
    out = []
    if llama3_rope_factors(cfg) is not None:
        dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        out.append(("rope_freqs.weight", None, (dim // 2,)))

    def key(n):
        g = gguf_name(n)
        if g.startswith("blk."):
            return (1, int(g.split(".")[1]), g)
        return (0 if g == "token_embd.weight" else 2, 0, g)
    for n in sorted(st.names(), key=key):
        if n.endswith("rotary_emb.inv_freq"):
            continue
        out.append((gguf_name(n), n, tuple(st.entries[n][2])))
    return out


def tensor_data(st, cfg, gname, hf_name, ftype, rows_per_chunk=8192):
    """Yield (bytes-like numpy chunk) of one tensor in the file's encoding, row chunks for 2-D."""
    if hf_name is None:  # rope_freqs
        yield llama3_rope_factors(cfg)
        return
    a = st.raw(hf_name)
    if gname.endswith("attn_q.weight"):
        a = permute_rope_rows(a, cfg["num_attention_heads"])
    elif gname.endswith("attn_k.weight"):
        a = permute_rope_rows(a, cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
    if a.ndim == 1 or ftype == "f32":
        for r in range(0, a.shape[0], rows_per_chunk):
            yield np.ascontiguousarray(to_f32(a[r:r + rows_per_chunk]))
    elif ftype == "bf16":
        for r in range(0, a.shape[0], rows_per_chunk):
            yield to_bf16_bits(a[r:r + rows_per_chunk])
    else:
        for r in range(0, a.shape[0], rows_per_chunk // 4):
            yield quantize_q8_0(to_f32(a[r:r + rows_per_chunk // 4]))


def write_gguf(gguf, st, cfg, path, ftype, name):
    """One GGUF file, streamed tensor by tensor (never the whole model in memory)."""
    Q = gguf.GGMLQuantizationType
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "bf16": gguf.LlamaFileType.MOSTLY_BF16,
                              "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[ftype]
    w = gguf.GGUFWriter(path, "llama")
    n_head = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    w.add_name(name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(cfg.get("num_key_value_heads", n_head))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(int(file_type))
    w.add_tokenizer_model("none")

    plan = plan_tensors(st, cfg)
    for gname, hf_name, shape in plan:
        if len(shape) == 1 or ftype == "f32":
            w.add_tensor_info(gname, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
        elif ftype == "bf16":
            w.add_tensor_info(gname, shape, np.dtype(np.uint16), 2 * int(np.prod(shape)),
                              raw_dtype=Q.BF16)
        else:
            byte_shape = (shape[0], shape[1] // QK8_0 * (2 + QK8_0))
            w.add_tensor_info(gname, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)),
                              raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    for gname, hf_name, shape in plan:
        # write_tensor_data wants one array a tensor; stream the chunks and pad as it does.
        w.write_padding(fout, fout.tell())
        ti = w.tensors[0].pop(gname)
        written = 0
        for chunk in tensor_data(st, cfg, gname, hf_name, ftype):
            chunk.tofile(fout)
            written += chunk.nbytes
        if written != ti.nbytes:
            raise SystemExit(f"llamacpp_gguf: {gname}: wrote {written} bytes, expected {ti.nbytes}")
        w.write_padding(fout, written)
    w.close()


def check_q8(gguf, st, cfg):
    """This file's Q8_0 against gguf-py's reference quantizer, byte for byte, on a few tensors."""
    names = [n for n in st.names() if len(st.entries[n][2]) == 2][:3]
    for n in names:
        x = to_f32(st.raw(n)[:256])
        mine = quantize_q8_0(x)
        ref = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
        if not np.array_equal(mine, ref):
            raise SystemExit(f"llamacpp_gguf: Q8_0 of {n} differs from gguf.quants")
    print(f"llamacpp_gguf: Q8_0 matches gguf.quants byte for byte ({', '.join(names)}, 256 rows)",
                file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face Llama directory")
    ap.add_argument("--out", required=True, help="output directory for model-TYPE.gguf")
    ap.add_argument("--types", default="f32,bf16,q8_0", help="comma list of f32, bf16, q8_0")
    ap.add_argument("--gguf-py", default=None, help="llama.cpp's gguf-py directory")
    ap.add_argument("--check-q8", action="store_true", help="compare Q8_0 with gguf.quants")
    ap.add_argument("--force", action="store_true", help="rewrite files that exist")
    args = ap.parse_args()
    if args.gguf_py:
        sys.path.insert(0, args.gguf_py)
    import gguf  # noqa: E402 (from --gguf-py when given)

    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "llama":
        raise SystemExit(f"llamacpp_gguf: model_type {cfg.get('model_type')!r}, only llama")
    st = SafetensorsDir(args.model)
    if args.check_q8:
        check_q8(gguf, st, cfg)
    os.makedirs(args.out, exist_ok=True)
    stamp = os.path.getmtime(os.path.join(args.model, "config.json"))
    for ftype in args.types.split(","):
        path = os.path.join(args.out, f"model-{ftype}.gguf")
        if not args.force and os.path.exists(path) and os.path.getmtime(path) >= stamp:
            print(f"llamacpp_gguf: {path} exists", file=sys.stderr)
            continue
        t0 = time.time()
        tmp = path + ".part"
        write_gguf(gguf, st, cfg, tmp, ftype, os.path.basename(os.path.normpath(args.model)))
        os.replace(tmp, path)
        print(f"llamacpp_gguf: wrote {path} ({os.path.getsize(path) / 1e9:.2f} GB, "
              f"{time.time() - t0:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
