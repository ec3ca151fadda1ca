"""Tiny Qwen2 and Qwen3 checkpoints written by transformers itself (save_pretrained, safetensors,
seeded), and transformers' greedy decoding of them as the reference. Running seqpar generate on
them is llama_ref's (run_generate, mesh_args, ranks_of, prompt_of)."""
import numpy as np
import torch
from transformers import (AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

from llama_ref import save_seeded

# GQA 8 heads over 2 kv heads, head_dim 16 (Qwen3: 32, apart from hidden / heads); a vocabulary
# that no tp size of the tests divides evenly; Qwen's rope_theta and eps.
VOCAB = 381
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=8,
            num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256,
            rms_norm_eps=1e-6, rope_theta=1000000.0)
FAMILIES = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}


def make_checkpoint(path, family, *, tied, dtype, sharded, seed=0, **overrides):
    """Writes a Qwen2ForCausalLM or Qwen3ForCausalLM with save_pretrained. Weights are scaled so
    that attention is far from uniform: q/k of std 2/sqrt(hidden) give logits of std about 4
    (Qwen2); Qwen3's per-head q_norm and k_norm scale each head's q and k to an RMS of their
    weights, so those are drawn around 2.5 (logits of std about 6); the other matrices
    1/sqrt(fan_in), embeddings of std 1, the other norms around 1, biases 0.1."""
    config_class, model_class = FAMILIES[family]
    kw = dict(TINY)
    if family == "qwen3":
        kw["head_dim"] = 32
    kw.update(overrides)
    cfg = config_class(**kw, tie_word_embeddings=tied, eos_token_id=None, bos_token_id=None,
                       pad_token_id=None)
    return save_seeded(model_class, cfg, path, dtype=dtype, sharded=sharded, seed=seed)


_models = {}


def model_of(path, **kwargs):
    key = (path, tuple(sorted(kwargs.items())))
    if key not in _models:
        _models[key] = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32,
                                                            **kwargs).eval()
    return _models[key]


def reference(path, prompt, new_tokens):
    """transformers' model in float32 (16-bit weights upcast): greedy tokens and the logits row
    that chose each."""
    model = model_of(path)
    ids = torch.tensor([prompt])
    tokens, logits = [], []
    with torch.no_grad():
        for _ in range(new_tokens):
            row = model(ids).logits[0, -1].double().numpy()
            t = int(row.argmax())
            tokens.append(t)
            logits.append(row)
            ids = torch.cat([ids, torch.tensor([[t]])], dim=1)
    return tokens, np.stack(logits)
