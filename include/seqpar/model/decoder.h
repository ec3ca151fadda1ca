// Decoder: the block graph of the causal language models (Llama, Qwen2, Qwen3: causal_lm.h),
// computed as transformers' *ForCausalLM computes it:
//   embed_tokens -> N x [x += self_attn(input_layernorm(x)); x += mlp(post_attention_layernorm(x))]
//   -> norm -> lm_head (or the embeddings, tied)
// with RMSNorms, GQA self-attention (rotate-half 1-D RoPE, optional llama3 frequency scaling, the
// biases and QK-norm the family's config chooses), causal, and a SwiGLU FFN. Prefill runs context
// parallel (the prompt sharded by the SpPlan: shard the input of layers.0, gather the output of
// norm); each layer keeps its K/V shard where prefill left it, and greedy decode runs pass-Q over
// that distributed cache (new token i is owned by sequence-parallel rank (prompt_len + i) mod N).
// The embedding and lm_head are split over the tensor-parallel group by vocabulary rows (a
// lookup is all-reduced, the logits all-gathered); every weight stays in its stored dtype.
// Packed documents (prefill_documents): several prompts one after another in one sequence,
// prefilled in one context-parallel pass, each attending itself only with RoPE positions from 0;
// no cache is kept (decoding after it is not supported).
// Thread-safety: one Decoder per rank thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "seqpar/model/blocks/attention.h"
#include "seqpar/model/blocks/ffn.h"
#include "seqpar/model/blocks/norm.h"
#include "seqpar/model/blocks/rope.h"
#include "seqpar/model/context.h"
#include "seqpar/model/presets.h"
#include "seqpar/model/sp_plan.h"

namespace seqpar {

// A causal language model's config on the Decoder's blocks: the shared shapes (ModelPreset:
// hidden, heads, kv_heads, head_dim, layers, ffn_dim, vocab, rope_theta) and the variants of the
// blocks its family's config reader chose (causal_lm.h).
struct DecoderConfig : ModelPreset {
  DecoderConfig() { family = ModelFamily::kLlm; }
  std::string family_name = "llama";  // the family that read it: llama, qwen2, qwen3
  double rms_norm_eps = 1e-5;         // every RMSNorm, the per-head QK-norm too
  RopeScaling rope_scaling;           // with rope_theta
  int64_t max_positions = 0;          // max_position_embeddings (0: no limit)
  bool tie_embeddings = false;        // lm_head is embed_tokens
  bool qkv_bias = false;              // q_proj, k_proj, v_proj biases
  bool o_bias = false;                // o_proj bias
  QkNorm qk_norm = QkNorm::kNone;     // kPerHead: self_attn.q_norm, k_norm (Qwen3)
  bool mlp_bias = false;              // gate_proj, up_proj, down_proj biases
  // The config keys that decided the optional tensors, for messages ("tie_word_embeddings
  // true, attention_bias false").
  std::string tensor_keys;

  // The layers' attention: these shapes and variants, under Hugging Face's names (q_proj, ...,
  // q_norm, k_norm), rotate-half RoPE.
  AttentionSpec attention() const;
};

// A runnable llm preset (tiny-llm, llama3-8b, ..., llama3.2-1b) as a Llama config; InvalidArgument
// naming the valid ones.
const DecoderConfig& decoder_preset(std::string_view name);

// The K/V cache dtypes (Decoder::Options::kv_cache) by the names users give them
// (`--kv-cache-dtype`, kv_cache_dtype=): "fp32", "bf16", "fp16"; nullopt for any other name.
// kv_cache_dtype_names() lists them, each in `quote`.
std::optional<DType> kv_cache_dtype_named(std::string_view name);
std::string kv_cache_dtype_names(std::string_view quote = "");

// How Decoder::check_documents names its parameters in messages (a CLI passes its flags).
struct DocumentNames {
  std::string_view prompts = "prompts";
  std::string_view allow_long_context = "allow_long_context=True";
};

class Decoder {
 public:
  // Names as in a Hugging Face checkpoint without its "model." prefix; lm_head.weight only when
  // the embeddings are not tied.
  static std::vector<WeightStore::Spec> parameters(const DecoderConfig& m);
  static const SpPlan& sp_plan();

  Decoder(const DecoderConfig& m, const WeightStore& ws, const ParallelContext& ctx);

  struct Options {
    int64_t max_new_tokens = 1;        // >= 1: prefill gives the first
    std::vector<int64_t> stop_tokens;  // generation ends after one of these
    // Called after each new token (rank-local; for progress reports): tokens so far, seconds.
    std::function<void(int64_t tokens, double prefill_s, double decode_s)> on_token;
    // Chunked prefill: the first prefill_chunk tokens of the prompt (at least one per
    // sequence-parallel rank) prefill context parallel,
    // each next chunk of at most prefill_chunk tokens attends the cache the earlier ones left
    // (its tokens split over the ranks as decode_placement splits new tokens), by pass-KV or
    // pass-Q (schedule default or ring) as chunk_strategy and chunk_schedule pin it, else as
    // choose_chunk answers for the chunk's call (the group's view: cached, new, the heads after
    // tp). 0: the whole prompt at once.
    int64_t prefill_chunk = 0;
    std::optional<Strategy> chunk_strategy;
    ScheduleKind chunk_schedule = ScheduleKind::kDefault;
    // The caller's "auto" (plan/selection.h choose_attention on a hardware profile: the model
    // layer does not link the planner): the strategy and schedule for a chunk's call over `ranks`
    // ranks, and why.
    std::function<std::pair<ParallelConfig, std::string>(const AttnShape& call, int ranks)>
        choose_chunk;
    // Chat turns: when the prompt's tokens are generated (max_new_tokens, or a stop token),
    // each next turn's prompt is appended after them: the last token generated, then the
    // turn's tokens attend the cache as chunks of prefill_chunk (the whole turn as one chunk
    // when 0), by pass-KV or pass-Q as for the prompt's chunks; then up to max_new_tokens
    // tokens again.
    std::vector<std::vector<int32_t>> next_turns;
    // The K/V cache's dtype (KvCache): fp32, or bf16 / fp16 (half the memory and the bytes a
    // decoded token reads; the keys, values and the queries over them rounded).
    DType kv_cache = DType::kF32;
  };
  // One chunk of a chunked prefill: prompt tokens [begin, end) over `cached` cached tokens.
  struct Chunk {
    int64_t begin = 0, end = 0, cached = 0;
    Strategy strategy = Strategy::kRing;  // the first chunk: the context's; then passkv / passq
    ScheduleKind schedule = ScheduleKind::kDefault;
    std::string reason;  // why (choose_chunk), or "pinned"
    double seconds = 0;  // this rank's wall time
  };
  struct Output {
    std::vector<int32_t> tokens;  // the greedy tokens: one from prefill, then one per decode step
    std::vector<Tensor> logits;   // (vocab) of each generated token's step
    double prefill_seconds = 0;   // this rank's wall time
    double decode_seconds = 0;
    bool stopped = false;       // ended at a stop token
    std::vector<Chunk> chunks;  // the prefill's chunks (one without prefill_chunk), then turns'
    std::vector<int64_t> turn_tokens;  // tokens generated per turn (the prompt's first)
  };
  // Prefill `prompt` (B = 1) context parallel, then greedy steps with pass-Q.
  Output generate(const std::vector<int32_t>& prompt, const Options& opts, ParallelContext& ctx);
  // The most tokens the K/V caches of sequence-parallel rank `rank` of `config` hold over
  // generate(prompt, opts) for a prompt of `prompt` tokens (a stop token ends a turn early): its
  // tokens of the first chunk's partition, then those of the prompt's later chunks, of the tokens
  // decoded and of each chat turn, placed as generate places them (a chunk's tokens on the last
  // ranks first, a decoded token at its position mod the ranks). Each layer's cache takes its
  // storage for these once, at the prefill.
  static int64_t cache_tokens(const Options& opts, int64_t prompt, const ParallelConfig& config,
                              int rank);
  // What generate(prompt, opts) holds at once on the ranks of `config`, at most: the tokens of
  // the prompt's first chunk (the prefill's, entering together over the sequence-parallel
  // ranks; at least one a rank) and the K/V cache tokens of the rank that holds the most
  // (cache_tokens). The memory checks before loading (causal_lm_memory) take these.
  struct Footprint {
    int64_t first_chunk = 0, cached = 0;
  };
  static Footprint footprint(const Options& opts, int64_t prompt, const ParallelConfig& config);
  // The bytes of the K/V caches of one rank of a tp group of `tp` holding `tokens` tokens: the
  // keys and values of every layer for its kv heads (tp splits them; beyond the kv heads each
  // rank holds one), at `dtype` (each tensor's storage rounded up to 64 bytes aside).
  static double cache_bytes(const DecoderConfig& m, int tp, int64_t tokens, DType dtype);
  // This rank's K/V caches now: the tokens each layer's holds, and the bytes of storage all
  // layers' keys and values hold (their dtype's).
  struct CacheUse {
    int64_t tokens = 0, bytes = 0;
  };
  CacheUse kv_cache_use() const;
  // The same with decode_steps steps after prefill and no stop tokens.
  Output generate(const std::vector<int32_t>& prompt, int decode_steps, ParallelContext& ctx);

  // Packed documents (varlen prefill): the prompts packed one after another into one sequence
  // (B = 1) of sum(len) tokens and prefilled in one context-parallel forward pass, as
  // transformers would run each prompt alone: every document attends only itself (causal inside
  // it: AttnShape::seq_lens, the attention layer's documents mask) and its RoPE positions restart
  // at 0. The sequence is sharded over the sequence-parallel group as the attention layer places
  // documents (place_call: Partition::documents splits each document by the layout on its own,
  // zigzag per document; contiguous runs over the packed sequence; pad adds padding after the
  // last document), by ctx's strategy (any that takes documents: local, ring, allgather,
  // ulysses, usp; not ring's schedule steal), heads over tp as in generate. No K/V cache is
  // kept: decoding after a packed prefill (several sequences' caches) is not supported.
  struct DocumentsOutput {
    std::vector<int32_t> tokens;     // per document: the greedy token after its last one
    std::vector<Tensor> logits;      // per document: (vocab), its last token's logits
    std::vector<Tensor> all_logits;  // with all_logits, per document: (length, vocab), every row
    double prefill_seconds = 0;      // this rank's wall time
  };
  // prompts: D >= 1 documents of >= 1 token ids each. Every rank of the mesh makes the call with
  // the same prompts; check_documents' refusals come before any communication, alike on every
  // rank.
  DocumentsOutput prefill_documents(const std::vector<std::vector<int32_t>>& prompts,
                                    ParallelContext& ctx, bool all_logits = false);
  // prefill_documents' checks, for callers that refuse before starting the ranks too: at least
  // one document, none empty, every token id in the vocabulary, each document within
  // max_position_embeddings (its positions restart at 0) unless allow_long_context, the packed
  // tokens within core/limits.h, and the attention call on the sequence-parallel group of `c`
  // (one sequence-parallel rank runs local, as model_context makes it): the strategy and
  // schedule take documents, every rank holds a token of the layout. InvalidArgument of one line
  // naming names.prompts (or names.allow_long_context) and what is valid. -> the call's
  // placement (place_call).
  static Placement check_documents(const DecoderConfig& m, const ParallelConfig& c,
                                   const std::vector<std::vector<int32_t>>& prompts,
                                   bool allow_long_context = true, const DocumentNames& names = {});

 private:
  // One generate call's state: where every rank's cache and queries are, the tokens cached.
  struct Turn {
    ParallelContext& ctx;
    const Options& opts;
    Output& out;
    KvPlacement place;
    int64_t length = 0;  // tokens in the cache
  };
  // Context-parallel prefill of tokens [0, n): the last layer's output (1, n, d) on every rank.
  Tensor prefill(std::span<const int32_t> tokens, Turn& turn);
  // tokens appended after the cache in chunks: the last chunk's output (1, T, d).
  Tensor extend(std::span<const int32_t> tokens, Turn& turn);
  void take_logits(const Tensor& x, Turn& turn);  // the last row's greedy token
  void decode(Turn& turn, double t1);  // until max_new_tokens of this turn or a stop token
  struct Layer {
    RmsNorm input_norm, post_norm;
    SelfAttention attn;
    FeedForward mlp;
    KvCache cache;
  };
  Tensor embed(std::span<const int32_t> tokens, Communicator& tp) const;  // (1, n, hidden)
  // (hidden) -> (vocab), or (rows, hidden) -> (rows, vocab)
  Tensor logits_of(const Tensor& h_last, Communicator& tp) const;
  Tensor rope(std::span<const int64_t> positions) const;  // (n, head_dim/2, 2)
  // One layer on x (1, n, hidden), its attention over the sequence (prefill) or, with `place`,
  // over the caches by `pass` (chunks and decode).
  // Over a cache (place given) the new tokens attend by pass.strategy and pass.schedule.
  // With `docs` (kDocuments) the layer's attention is over packed documents, no cache.
  void layer_forward(Layer& layer, Tensor& x, const Tensor& rope, ParallelContext& ctx,
                     const SpRuntime* sp, const KvPlacement* place, const ParallelConfig& pass,
                     const AttendOver* docs = nullptr);
  DecoderConfig m_;
  std::vector<float> inv_freq_;
  int64_t v0_ = 0, v1_ = 0;           // this tp rank's vocabulary rows of embed and lm_head
  std::vector<size_t> vocab_bytes_;   // every tp rank's logits bytes
  Tensor embed_w, lm_head_w;          // stored dtype or int8; lm_head_w empty when tied
  Tensor embed_scale, lm_head_scale;  // scales of int8 weights (WeightStore::weight_format)
  DType activations_ = DType::kF32;   // lm_head's input rounded to it (WeightStore::activations)
  RmsNorm norm_;
  std::vector<Layer> layers_;
};

}  // namespace seqpar
