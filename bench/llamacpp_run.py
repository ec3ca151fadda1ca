#!/usr/bin/env python3
"""llamacpp_run: greedy generation from token ids with llama.cpp (through the llama_cpp Python
binding's C API, ctypes), timed like `seqpar generate --json`, for bench/compare_llamacpp.sh.
Not a test.

  llamacpp_run.py generate --model GGUF --prompt-ids-file F --max-new-tokens N
                           [--threads 2] [--kv-type f16|f32] [--output OUT.npz]
  llamacpp_run.py compare --seqpar SEQPAR.safetensors --llamacpp OUT.npz

generate prints one JSON object. As seqpar: prefill_seconds is the prompt's forward pass up to
its last position's logits (the first new token, argmax); decode_seconds the N - 1 one-token
passes after it (each with its argmax). No warm-up pass (seqpar generate has none either). The
weights are read into memory at load, as seqpar reads its safetensors before its clock starts
(--mmap: llama.cpp's default memory map, where the first pass pages the weights in and pays for
it). llama.cpp's defaults otherwise: its CPU weight repacking at load where it has a layout for
the type, n_ubatch 512 (a 2048-token prompt runs as 4 micro-batches; n_batch covers the
prompt), flash attention "auto" (on, on CPU), K/V cache f16 unless --kv-type f32. --output
writes tokens (int64 [N]) and logits (float32 [N, vocab]) as .npz.

compare prints max |logit difference| on the first row (the prompt's last position, where both
programs have seen the same tokens), on every row up to the first token where they disagree,
and the tokens' agreement.
"""

import argparse
import ctypes
import json
import os
import struct
import sys
import time

import numpy as np


def read_ids(path):
    """Token ids from a text file (commas or whitespace)."""
    with open(path) as f:
        return [int(t) for t in f.read().replace(",", " ").split()]


def generate(a):
    import llama_cpp as L

    prompt = read_ids(a.prompt_ids_file)
    n_new = a.max_new_tokens
    if not a.verbose:
        # llama.cpp logs to stderr through this callback; keep errors only.
        @L.llama_log_callback
        def quiet(level, text, user_data):
            if level == 4:  # GGML_LOG_LEVEL_ERROR
                sys.stderr.write(text.decode(errors="replace"))
        a._keep = quiet
        L.llama_log_set(quiet, ctypes.c_void_p())
    L.llama_backend_init()

    t0 = time.perf_counter()
    mp = L.llama_model_default_params()
    if not a.mmap:
        mp.load_mode = L.LLAMA_LOAD_MODE_NONE  # read into memory at load, as seqpar does
    if a.no_extra_bufts:
        mp.use_extra_bufts = False  # no repacked (AMX, CPU_REPACK) weight buffers
    model = L.llama_model_load_from_file(a.model.encode(), mp)
    if not model:
        raise SystemExit(f"llamacpp_run: cannot load {a.model}")
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    cp = L.llama_context_default_params()
    n_ctx = len(prompt) + n_new + 1
    cp.n_ctx = n_ctx
    cp.n_batch = max(n_ctx, 512)
    cp.n_threads = a.threads
    cp.n_threads_batch = a.threads
    if a.kv_type == "f32":
        cp.type_k = L.GGML_TYPE_F32
        cp.type_v = L.GGML_TYPE_F32
    cp.flash_attn_type = {"auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO,
                          "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                          "off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED}[a.flash_attn]
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise SystemExit("llamacpp_run: cannot make a context")
    load_s = time.perf_counter() - t0

    batch = L.llama_batch_init(max(len(prompt), 1), 0, 1)

    def run(tokens, pos0):
        """Decode tokens at positions pos0.. ; logits of the last one (n_vocab,) float32."""
        batch.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            batch.token[i] = t
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if i == len(tokens) - 1 else 0
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            raise SystemExit(f"llamacpp_run: llama_decode returned {rc}")
        L.llama_synchronize(ctx)
        p = L.llama_get_logits_ith(ctx, len(tokens) - 1)
        return np.ctypeslib.as_array(p, shape=(n_vocab,))

    tokens, logits = [], []
    t0 = time.perf_counter()
    row = run(prompt, 0)
    tokens.append(int(np.argmax(row)))
    prefill_s = time.perf_counter() - t0
    if a.output:
        logits.append(row.copy())
    t0 = time.perf_counter()
    for step in range(1, n_new):
        row = run([tokens[-1]], len(prompt) + step - 1)
        tokens.append(int(np.argmax(row)))
        if a.output:
            logits.append(row.copy())
    decode_s = time.perf_counter() - t0

    if a.output:  # a temporary file beside it, renamed over it once written
        if os.path.realpath(a.output) == os.path.realpath(a.model):
            sys.exit(f"llamacpp_run: --output {a.output} is the model file")
        tmp = a.output + ".part"
        with open(tmp, "wb") as f:
            np.savez(f, tokens=np.array(tokens, dtype=np.int64),
                     logits=np.stack(logits).astype(np.float32))
        os.replace(tmp, a.output)
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    steps = max(n_new - 1, 1)
    print(json.dumps({
        "model": a.model, "threads": a.threads, "kv_type": a.kv_type, "mmap": a.mmap,
        "extra_bufts": not a.no_extra_bufts,
        "flash_attn": a.flash_attn,
        "prompt_tokens": len(prompt), "new_tokens": n_new, "load_seconds": load_s,
        "prefill_seconds": prefill_s, "prefill_tokens_per_second": len(prompt) / prefill_s,
        "decode_seconds": decode_s, "decode_seconds_per_token": decode_s / steps,
        "decode_tokens_per_second": steps / decode_s if decode_s > 0 else 0.0,
        "tokens": tokens,
        "llama_cpp_version": L.__version__,
    }))


def read_safetensors(path):
    """{name: array} of a safetensors file (F32, I64, I32 only)."""
    kinds = {"F32": np.float32, "I64": np.int64, "I32": np.int32}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=kinds[info["dtype"]]).reshape(info["shape"])
    return out


def compare(a):
    sp = read_safetensors(a.seqpar)
    lc = np.load(a.llamacpp)
    st, lt = sp["tokens"].astype(np.int64), lc["tokens"]
    sl, ll = sp["logits"].astype(np.float32), lc["logits"]
    n = min(len(st), len(lt))
    agree = int(np.sum(st[:n] == lt[:n]))
    prefix = n
    for i in range(n):
        if st[i] != lt[i]:
            prefix = i
            break
    # Row i's logits condition on the tokens before it: equal inputs up to the first disagreement.
    rows = max(prefix, 1)
    diff = np.abs(sl[:rows] - ll[:rows])
    print(json.dumps({
        "tokens": n, "tokens_agree": agree, "agree_prefix": prefix,
        "max_abs_logit_diff_first": float(np.abs(sl[0] - ll[0]).max()),
        "max_abs_logit_diff_prefix": float(diff.max()),
        "max_abs_logit_first": float(np.abs(sl[0]).max()),
        "argmax_margin_first": float(np.sort(sl[0])[-1] - np.sort(sl[0])[-2]),
        "seqpar_tokens": st[:n].tolist(), "llamacpp_tokens": lt[:n].tolist(),
    }))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--model", required=True, help="GGUF file")
    g.add_argument("--prompt-ids-file", required=True, help="token ids, commas or whitespace")
    g.add_argument("--max-new-tokens", type=int, default=16)
    g.add_argument("--threads", type=int, default=2)
    g.add_argument("--kv-type", choices=["f16", "f32"], default="f16")
    g.add_argument("--flash-attn", choices=["auto", "on", "off"], default="auto")
    g.add_argument("--mmap", action="store_true", help="map the GGUF (llama.cpp's default)")
    g.add_argument("--no-extra-bufts", action="store_true",
                   help="llama.cpp's weights in plain CPU buffers, not repacked for AMX or "
                        "CPU_REPACK (use_extra_bufts false)")
    g.add_argument("--output", default=None, help=".npz: tokens and logits")
    g.add_argument("--verbose", action="store_true", help="llama.cpp's log on stderr")
    c = sub.add_parser("compare")
    c.add_argument("--seqpar", required=True, help="seqpar generate --output file")
    c.add_argument("--llamacpp", required=True, help="llamacpp_run.py generate --output file")
    a = ap.parse_args()
    generate(a) if a.cmd == "generate" else compare(a)


if __name__ == "__main__":
    main()
