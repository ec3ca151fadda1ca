#!/usr/bin/env python3
"""int8_accuracy: seqpar generate with --weights-dtype int8 (Q8_0 matrices) and --weights-dtype
int8-channel (one fp32 scale per output row), or other variants such as --activations bf16,
each against the same checkpoint's own weights in fp32 activations, greedy over N steps on one
prompt.

  bench/int8_accuracy.py --seqpar build/seqpar --model DIR [--prompt 256] [--steps 64]
                         [--variant "--weights-dtype int8" --variant "--activations bf16" ...]

Reports, for each variant (default: int8 and int8-channel), over the steps whose context is the
same in both runs (every step up to and including the first whose greedy tokens differ): the
largest |logit difference|, the mean and least overlap of the ten highest logits and that overlap
at every step, and how many greedy tokens agree. Not a test: nothing passes or fails. Needs numpy
and safetensors (build/pyenv has both)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file


def generate(args, prompt_file, out, flags):
    cmd = [args.seqpar, "generate", "--model", args.model, "--prompt-ids-file", prompt_file,
           "--max-new-tokens", str(args.steps), "--ignore-eos", "--json", "--quiet",
           "--output", out, *flags, *args.mesh.split()]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"int8_accuracy: {' '.join(cmd)} failed:\n{r.stderr}")
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    t = load_file(out)
    return summary, t["tokens"].tolist(), t["logits"].astype(np.float64)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqpar", default="build/seqpar")
    p.add_argument("--model", default="/tmp/seqpar_llama3.2-1b_bf16")
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--mesh", default="", help="extra generate flags, e.g. '--tp 2'")
    p.add_argument("--variant", action="append",
                   help="a compared run's generate flags, repeatable (the reference has none); "
                   "default: '--weights-dtype int8' and '--weights-dtype int8-channel'")
    args = p.parse_args()
    variants = args.variant or ["--weights-dtype int8", "--weights-dtype int8-channel"]
    with open(os.path.join(args.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    with tempfile.TemporaryDirectory() as tmp:
        prompt_file = os.path.join(tmp, "prompt.txt")
        rng = np.random.default_rng(0)
        with open(prompt_file, "w") as f:
            f.write(",".join(map(str, rng.integers(0, vocab, args.prompt).tolist())))
        s_ref, tok_ref, log_ref = generate(args, prompt_file, os.path.join(tmp, "ref.st"), [])
        runs = [(v, *generate(args, prompt_file, os.path.join(tmp, f"v{i}.st"), v.split()))
                for i, v in enumerate(variants)]
    results = []
    for variant, s_v, tok_v, log_v in runs:
        agree = 0
        while agree < len(tok_ref) and tok_ref[agree] == tok_v[agree]:
            agree += 1
        same_context = min(agree + 1, len(tok_ref))
        err = np.abs(log_ref[:same_context] - log_v[:same_context]).max(axis=1)
        top = [len(set(np.argsort(-log_ref[i])[:10]) & set(np.argsort(-log_v[i])[:10]))
               for i in range(same_context)]
        spread = float(np.mean([log_ref[i].std() for i in range(same_context)]))
        results.append({
            "model": args.model, "prompt": args.prompt, "steps": args.steps, "mesh": args.mesh,
            "variant": variant,
            "greedy_tokens_agreeing": agree, "steps_compared": same_context,
            "max_abs_logit_error": float(err.max()), "median_step_max_abs_logit_error":
                float(np.median(err)), "logit_std": spread,
            "top10_overlap_mean": float(np.mean(top)), "top10_overlap_min": int(min(top)),
            "top10_overlap_per_step": top,
            "decode_tokens_per_second": {"checkpoint": s_ref["decode_tokens_per_second"],
                                         "variant": s_v["decode_tokens_per_second"]},
            "prefill_tokens_per_second": {"checkpoint": s_ref["prefill_tokens_per_second"],
                                          "variant": s_v["prefill_tokens_per_second"]},
            "peak_resident_bytes_per_rank": {"checkpoint": s_ref["peak_resident_bytes_per_rank"],
                                             "variant": s_v["peak_resident_bytes_per_rank"]},
        })
    print(json.dumps(results if len(results) > 1 else results[0], indent=1))

if __name__ == "__main__":
    main()
