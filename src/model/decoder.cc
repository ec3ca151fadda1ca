#include "seqpar/model/decoder.h"

#include <cmath>
#include <cstring>
#include <iterator>

#include "seqpar/core/block_cache.h"
#include "seqpar/core/limits.h"
#include "seqpar/core/param_error.h"
#include "seqpar/core/timer.h"
#include "seqpar/core/trace.h"
#include "seqpar/model/ops.h"
#include "seqpar/parallel/cp_attention.h"
#include "seqpar/parallel/strategy_table.h"

namespace seqpar {

AttentionSpec DecoderConfig::attention() const {
  AttentionSpec a;
  a.hidden = hidden;
  a.heads = heads;
  a.kv_heads = kv_heads;
  a.head_dim = head_dim;
  a.qkv_bias = qkv_bias;
  a.o_bias = o_bias;
  a.qk_norm = qk_norm;
  a.qk_norm_eps = static_cast<float>(rms_norm_eps);
  a.rope_pairs = RopePairs::kHalves;  // Hugging Face's q_proj/k_proj row layout
  a.proj = {"q_proj", "k_proj", "v_proj", "o_proj"};
  a.norm = {"q_norm", "k_norm"};
  return a;
}

std::vector<WeightStore::Spec> Decoder::parameters(const DecoderConfig& m) {
  const int64_t d = m.hidden;
  // Seeded q/k weights of std 2/sqrt(d) give logits q·k/sqrt(D) of std about 4, so that seeded
  // models attend far from uniformly (with 0.02 every position would look alike).
  const float qk_std = 2.0f / std::sqrt(static_cast<float>(d));
  const AttentionSpec attention = m.attention();
  std::vector<WeightStore::Spec> p = {{"embed_tokens.weight", {m.vocab, d}, 1.0f}};
  auto append = [&](std::vector<WeightStore::Spec> more) {
    p.insert(p.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  };
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string l = "layers." + std::to_string(i) + ".";
    p.push_back({l + "input_layernorm.weight", {d}, -1});
    append(attention.parameters(l + "self_attn", qk_std, 0.02f));
    p.push_back({l + "post_attention_layernorm.weight", {d}, -1});
    append(FeedForward::parameters(l + "mlp", FeedForward::Kind::kSwiGlu, d, m.ffn_dim, m.mlp_bias,
                                   0.02f));
  }
  p.push_back({"norm.weight", {d}, -1});
  if (!m.tie_embeddings) p.push_back({"lm_head.weight", {m.vocab, d}});
  return p;
}

const SpPlan& Decoder::sp_plan() {
  static const SpPlan plan = {
      {"layers.0", SpAction::kShard, {"hidden", "rope"}},
      {"norm", SpAction::kGather, {"hidden"}},
  };
  return plan;
}

namespace {
// Vocabulary rows of tp rank r of n (any vocabulary size).
IndexRange vocab_share(int64_t vocab, int r, int n) { return {vocab * r / n, vocab * (r + 1) / n}; }
}  // namespace

Decoder::Decoder(const DecoderConfig& m, const WeightStore& ws, const ParallelContext& ctx)
    : m_(m), inv_freq_(rope_inv_freq(m.head_dim, m.rope_theta, m.rope_scaling)) {
  SEQPAR_PARAM_CHECK(m.family == ModelFamily::kLlm, "model", "", param("model"), " ", m.name,
                     " is not a decoder");
  const int tp = ctx.tp_size();
  SEQPAR_PARAM_CHECK(m.heads % tp == 0 && (m.kv_heads % tp == 0 || tp % m.kv_heads == 0), "tp", "",
                     param("tp"), " ", tp, " must divide the ", m.heads,
                     " heads, and divide or be a multiple of the ", m.kv_heads, " kv heads of ",
                     m.name);
  SEQPAR_PARAM_CHECK(m.ffn_dim % tp == 0, "tp", "", param("tp"), " ", tp,
                     " must divide the intermediate size ", m.ffn_dim, " of ", m.name);
  auto [v0, v1] = vocab_share(m.vocab, ctx.tp_rank(), tp);
  v0_ = v0;
  v1_ = v1;
  for (int r = 0; r < tp; ++r) {
    auto [a, b] = vocab_share(m.vocab, r, tp);
    vocab_bytes_.push_back(static_cast<size_t>(b - a) * sizeof(float));
  }
  const float eps = static_cast<float>(m.rms_norm_eps);
  hold_matrix(ws, "embed_tokens.weight", ws.rows("embed_tokens.weight", v0_, v1_), embed_w,
              embed_scale);
  if (!m.tie_embeddings)
    hold_matrix(ws, "lm_head.weight", ws.rows("lm_head.weight", v0_, v1_), lm_head_w,
                lm_head_scale);
  norm_ = RmsNorm::load(ws, "norm", eps);
  activations_ = ws.activations();
  const AttentionSpec attention = m.attention();
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string l = "layers." + std::to_string(i) + ".";
    Layer layer;
    layer.input_norm = RmsNorm::load(ws, l + "input_layernorm", eps);
    layer.post_norm = RmsNorm::load(ws, l + "post_attention_layernorm", eps);
    layer.attn = SelfAttention::load(ws, l + "self_attn", attention, ctx);
    layer.mlp =
        FeedForward::load(ws, l + "mlp", FeedForward::Kind::kSwiGlu, m.ffn_dim, m.mlp_bias, ctx);
    layers_.push_back(std::move(layer));
  }
}

void Decoder::layer_forward(Layer& layer, Tensor& x, const Tensor& rope, ParallelContext& ctx,
                            const SpRuntime* sp, const KvPlacement* place,
                            const ParallelConfig& pass, const AttendOver* docs) {
  const int64_t l = &layer - layers_.data();
  // --trace: a slice per layer's attention and MLP half (norm and residual add included).
  auto name = [l](const char* part) {
    return trace::enabled() ? detail::concat("layer ", l, " ", part) : std::string();
  };
  std::optional<trace::Scope> half(std::in_place, name("self_attn"), "model",
                                   trace::Lane::kCompute);
  const Tensor h = layer.input_norm.forward(x);
  expect_finite(h, "layers", l, "input_layernorm");
  const Tensor a =
      docs    ? layer.attn.forward(h, rope, ctx, *docs)
      : place ? layer.attn.decode(h, rope, ctx, layer.cache, *place, pass.strategy, pass.schedule)
              : layer.attn.forward(h, rope, ctx, *sp, true, &layer.cache);
  expect_finite(a, "layers", l, "self_attn");
  add_(x, a);
  expect_finite(x, "layers", l, "self_attn's residual add");
  half.reset();
  half.emplace(name("mlp"), "model", trace::Lane::kCompute);
  const Tensor g = layer.post_norm.forward(x);
  expect_finite(g, "layers", l, "post_attention_layernorm");
  const Tensor m = layer.mlp.forward(g, *ctx.tp);
  expect_finite(m, "layers", l, "mlp");
  add_(x, m);
  expect_finite(x, "layers", l, "mlp's residual add");
}

Tensor Decoder::embed(std::span<const int32_t> tokens, Communicator& tp) const {
  const int64_t n = static_cast<int64_t>(tokens.size()), d = m_.hidden;
  const size_t row_bytes = static_cast<size_t>(d) * dtype_size(embed_w.dtype());
  Tensor x({1, n, d});
  for (int64_t i = 0; i < n; ++i) {
    SEQPAR_ARG_CHECK(tokens[i] >= 0 && tokens[i] < m_.vocab, "token ", tokens[i],
                     " is outside the vocabulary of ", m_.vocab);
    if (tokens[i] < v0_ || tokens[i] >= v1_) continue;  // another tp rank's row
    if (!embed_scale.empty()) {
      dequantize_int8(embed_w, embed_scale, tokens[i] - v0_, 1, x.data<float>() + i * d);
      continue;
    }
    convert(static_cast<const std::byte*>(embed_w.raw()) + (tokens[i] - v0_) * row_bytes,
            embed_w.dtype(), x.data<float>() + i * d, DType::kF32, static_cast<size_t>(d));
  }
  if (tp.size() > 1) tp.all_reduce(std::span<float>(x.data<float>(), x.numel()), ReduceOp::kSum);
  return x;
}

Tensor Decoder::logits_of(const Tensor& h_last, Communicator& tp) const {
  const Tensor& head = m_.tie_embeddings ? embed_w : lm_head_w;
  const Tensor& head_scale = m_.tie_embeddings ? embed_scale : lm_head_scale;
  const Tensor h = norm_.forward(h_last);
  expect_finite(h, "norm");
  Tensor mine = linear(h, head, Tensor(), head_scale, activations_);  // (v1 - v0) or (rows, ..)
  expect_finite(mine, "lm_head");
  if (tp.size() == 1) return mine;
  if (h_last.ndim() == 1) {
    Tensor all({m_.vocab});
    tp.all_gatherv(mine.raw(), all.raw(), vocab_bytes_);
    return all;
  }
  // Rows: every tp rank's (rows, its vocabulary share) gathered, then interleaved by row.
  const int64_t rows = h_last.dim(0);
  std::vector<size_t> bytes(vocab_bytes_.size());
  for (size_t r = 0; r < bytes.size(); ++r) bytes[r] = vocab_bytes_[r] * rows;
  std::vector<float> blocks(static_cast<size_t>(rows * m_.vocab));
  tp.all_gatherv(mine.raw(), blocks.data(), bytes);
  Tensor all({rows, m_.vocab});
  const float* src = blocks.data();
  int64_t v0 = 0;
  for (size_t r = 0; r < bytes.size(); ++r) {
    const int64_t share = static_cast<int64_t>(vocab_bytes_[r] / sizeof(float));
    for (int64_t i = 0; i < rows; ++i, src += share)
      std::memcpy(all.data<float>() + i * m_.vocab + v0, src, share * sizeof(float));
    v0 += share;
  }
  return all;
}

std::optional<DType> kv_cache_dtype_named(std::string_view name) {
  if (name == "fp32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  if (name == "fp16") return DType::kF16;
  return std::nullopt;
}

std::string kv_cache_dtype_names(std::string_view quote) {
  return detail::concat(quote, "fp32", quote, ", ", quote, "bf16", quote, ", ", quote, "fp16",
                        quote);
}

Tensor Decoder::rope(std::span<const int64_t> positions) const {
  return rope_1d(positions, inv_freq_);
}

namespace {
// A layer's causal attention call as the sequence-parallel group sees it (heads after tp);
// the caller sets the lengths.
AttnShape group_call(const DecoderConfig& m, int tp) {
  AttnShape call;
  call.heads = m.heads / tp;
  call.kv_heads = std::max<int64_t>(1, m.kv_heads / tp);
  call.head_dim = m.head_dim;
  call.causal = true;
  call.lse = false;  // the blocks keep the output only (attend())
  return call;
}

// The prompt's first chunk: prefill_chunk tokens, at least one for every sequence-parallel rank
// (the whole prompt without chunks).
int64_t first_chunk(const Decoder::Options& opts, int64_t prompt, int n) {
  return opts.prefill_chunk > 0 ? std::min(prompt, std::max<int64_t>(opts.prefill_chunk, n))
                                : prompt;
}

// The tokens sequence-parallel rank r of n takes into its caches after the prompt's first chunk
// of `first` tokens, at most (a stop token ends a turn early): placed as extend() places a
// chunk's tokens (new_token_share, the last ranks first) and decode() a decoded one (position mod
// n), for the prompt's other chunks, the tokens decoded and each chat turn.
int64_t later_tokens(const Decoder::Options& opts, int64_t prompt, int64_t first, int n, int r) {
  int64_t length = first, mine = 0;
  const auto extend = [&](int64_t total) {
    const int64_t size = opts.prefill_chunk > 0 ? opts.prefill_chunk : total;
    for (int64_t c0 = 0; c0 < total; c0 += size) {
      const int64_t T = std::min(size, total - c0);
      mine += new_token_share(T, n, r);
      length += T;
    }
  };
  // Positions p < x with p mod n == r.
  const auto owned_below = [&](int64_t x) { return x <= r ? 0 : (x - r - 1) / n + 1; };
  const auto decode = [&] {  // max_new_tokens - 1 tokens fed back, one a step
    const int64_t fed = opts.max_new_tokens - 1;
    mine += owned_below(length + fed) - owned_below(length);
    length += fed;
  };
  extend(prompt - first);
  decode();
  for (const std::vector<int32_t>& t : opts.next_turns) {
    extend(static_cast<int64_t>(t.size()) + 1);  // the last token chosen, then the turn's
    decode();
  }
  return mine;
}

int32_t argmax(const Tensor& logits) {
  int32_t best = 0;
  for (int64_t i = 1; i < logits.numel(); ++i)
    if (logits.data<float>()[i] > logits.data<float>()[best]) best = static_cast<int32_t>(i);
  return best;
}
}  // namespace

Decoder::Output Decoder::generate(const std::vector<int32_t>& prompt, int decode_steps,
                                  ParallelContext& ctx) {
  SEQPAR_ARG_CHECK(decode_steps >= 0, "decode_steps ", decode_steps, " is invalid");
  Options opts;
  opts.max_new_tokens = int64_t{decode_steps} + 1;
  return generate(prompt, opts, ctx);
}

Decoder::Output Decoder::generate(const std::vector<int32_t>& prompt, const Options& opts,
                                  ParallelContext& ctx) {
  const int64_t P = static_cast<int64_t>(prompt.size());
  SEQPAR_ARG_CHECK(P >= 1, "the prompt is empty");
  SEQPAR_PARAM_CHECK(opts.max_new_tokens >= 1, "max_new_tokens", "", param("max_new_tokens"), " ",
                     opts.max_new_tokens, " is invalid; valid: 1 or more");
  SEQPAR_PARAM_CHECK(opts.prefill_chunk >= 0, "prefill_chunk", "", param("prefill_chunk"), " ",
                     opts.prefill_chunk,
                     " is invalid; valid: 0 (the whole prompt at once) or more");
  for (size_t t = 0; t < opts.next_turns.size(); ++t)
    SEQPAR_ARG_CHECK(!opts.next_turns[t].empty(), "turn ", t + 2, " of the chat is empty");
  SEQPAR_ARG_CHECK(
      opts.kv_cache == DType::kF32 || opts.kv_cache == DType::kBF16 || opts.kv_cache == DType::kF16,
      "a K/V cache of ", dtype_name(opts.kv_cache),
      " is not supported; valid: ", kv_cache_dtype_names());
  // ---- the prompt: its first chunk context parallel, the rest over the cache.
  const int64_t first = first_chunk(opts, P, ctx.sp_size());
  // Each layer's cache takes its storage once, for this rank's tokens to come.
  const int64_t more = later_tokens(opts, P, first, ctx.sp_size(), ctx.sp_rank());
  for (Layer& layer : layers_) layer.cache = KvCache{opts.kv_cache, more, {}, {}, {}};
  Output out;
  Turn turn{ctx, opts, out, {}, 0};
  const double t0 = now_seconds();
  const std::span<const int32_t> tokens(prompt);
  Tensor x = prefill(tokens.first(first), turn);
  if (first < P) x = extend(tokens.subspan(first), turn);
  take_logits(x, turn);
  out.prefill_seconds = now_seconds() - t0;
  if (opts.on_token) opts.on_token(1, out.prefill_seconds, 0);
  decode(turn, t0 + out.prefill_seconds);
  out.turn_tokens.push_back(static_cast<int64_t>(out.tokens.size()));
  // ---- chat turns: the last token chosen (not yet in the cache), then the turn's prompt.
  for (const std::vector<int32_t>& next : opts.next_turns) {
    const double tt = now_seconds();
    const int64_t before = static_cast<int64_t>(out.tokens.size());
    std::vector<int32_t> fresh{out.tokens.back()};
    fresh.insert(fresh.end(), next.begin(), next.end());
    out.stopped = false;
    take_logits(extend(fresh, turn), turn);
    out.prefill_seconds += now_seconds() - tt;
    decode(turn, now_seconds());
    out.turn_tokens.push_back(static_cast<int64_t>(out.tokens.size()) - before);
  }
  return out;
}

int64_t Decoder::cache_tokens(const Options& opts, int64_t prompt, const ParallelConfig& config,
                              int rank) {
  const int n = config.sp();
  SEQPAR_ARG_CHECK(prompt >= n && rank >= 0 && rank < n, "cache_tokens: a prompt of ", prompt,
                   " tokens and rank ", rank, " on ", n,
                   " sequence-parallel ranks; valid: at least one token a rank, rank 0 to ", n - 1);
  // The first chunk's real tokens in the prefill's partition.
  const int64_t first = first_chunk(opts, prompt, n);
  const Partition part = SpRuntime::partition_of(first, n, config);
  int64_t mine = 0;
  for (int64_t p : part.positions(rank)) mine += p < first ? 1 : 0;
  return mine + later_tokens(opts, prompt, first, n, rank);
}

Decoder::Footprint Decoder::footprint(const Options& opts, int64_t prompt,
                                      const ParallelConfig& config) {
  const int n = config.sp();
  SEQPAR_ARG_CHECK(prompt >= n, "the prompt has ", prompt, " tokens, fewer than the ", n,
                   " sequence-parallel ranks (padding or not, every rank needs a token); use at "
                   "most ",
                   prompt, " ranks, or a longer prompt");
  Footprint f;
  f.first_chunk = first_chunk(opts, prompt, n);
  for (int r = 0; r < n; ++r) f.cached = std::max(f.cached, cache_tokens(opts, prompt, config, r));
  return f;
}

double Decoder::cache_bytes(const DecoderConfig& m, int tp, int64_t tokens, DType dtype) {
  const double kv_heads = std::max(1.0, static_cast<double>(m.kv_heads) / tp);
  return 2.0 * static_cast<double>(dtype_size(dtype)) * static_cast<double>(m.layers) * kv_heads *
         static_cast<double>(m.head_dim) * static_cast<double>(tokens);
}

Decoder::CacheUse Decoder::kv_cache_use() const {
  CacheUse use;
  if (!layers_.empty()) use.tokens = static_cast<int64_t>(layers_[0].cache.positions.size());
  for (const Layer& layer : layers_)
    use.bytes +=
        static_cast<int64_t>(layer.cache.k.capacity_bytes() + layer.cache.v.capacity_bytes());
  return use;
}

Tensor Decoder::prefill(std::span<const int32_t> tokens, Turn& turn) {
  ParallelContext& ctx = turn.ctx;
  const int64_t first = static_cast<int64_t>(tokens.size()), hd = m_.head_dim;
  const double t0 = now_seconds();
  SpRuntime sp(sp_plan(), ctx, first);
  std::vector<int64_t> all_pos(first);
  for (int64_t i = 0; i < first; ++i) all_pos[i] = i;
  Tensor x = sp.at("layers.0", "hidden", embed(tokens, *ctx.tp));
  Tensor table = sp.at("layers.0", "rope", reshape(rope(all_pos), {1, first, hd}));
  table = reshape(std::move(table), {x.dim(1), hd / 2, 2});
  for (Layer& layer : layers_) layer_forward(layer, x, table, ctx, &sp, nullptr, ctx.config);
  x = sp.at("norm", "hidden", std::move(x));  // (1, first, d) on every rank
  turn.out.chunks.push_back({0, first, 0, ctx.config.strategy, ctx.config.schedule,
                             "context-parallel prefill", now_seconds() - t0});
  // The caches prefill left: each rank's real tokens of the partition.
  const int n = ctx.sp_size();
  turn.place.kv_pos.assign(n, {});
  turn.place.q_pos.assign(n, {});
  const Partition& part = sp.partition();
  for (int r = 0; r < n; ++r)
    for (int64_t p : part.positions(r))
      if (p < first) turn.place.kv_pos[r].push_back(p);
  turn.length = first;
  return x;
}

Tensor Decoder::extend(std::span<const int32_t> tokens, Turn& turn) {
  ParallelContext& ctx = turn.ctx;
  const Options& opts = turn.opts;
  const int n = ctx.sp_size();
  const int64_t total = static_cast<int64_t>(tokens.size());
  const int64_t size = opts.prefill_chunk > 0 ? opts.prefill_chunk : total;
  Tensor x;
  // Chunks of T tokens over the cache, split over the ranks as decode_placement splits new
  // tokens, replicated activations, pass-KV or pass-Q per chunk.
  for (int64_t c0 = 0; c0 < total; c0 += size) {
    const double tc = now_seconds();
    const int64_t T = std::min(size, total - c0), begin = turn.length;
    Chunk chunk{begin, begin + T, begin, Strategy::kPassQ, ScheduleKind::kDefault, "pinned", 0};
    if (opts.chunk_strategy) {
      chunk.strategy = *opts.chunk_strategy;
      chunk.schedule = opts.chunk_schedule;
    } else {
      SEQPAR_PARAM_CHECK(opts.choose_chunk != nullptr, "chunk_strategy", "passkv, passq",
                         param("prefill_chunk"), " and chat turns need a ", param("chunk_strategy"),
                         " (passkv, passq) or a chooser (auto on a ", param("hardware"),
                         " profile)");
      AttnShape call = group_call(m_, ctx.tp_size());
      call.dtype = opts.kv_cache;
      call.cached = begin;
      call.fresh = T;
      call.seq = begin + T;
      const auto [chosen, why] = opts.choose_chunk(call, n);
      chunk.strategy = chosen.strategy;
      chunk.schedule = chosen.schedule;
      chunk.reason = why;
    }
    KvPlacement& place = turn.place;
    int64_t next = begin;
    for (int r = 0; r < n; ++r) {
      place.q_pos[r].clear();
      const int64_t share = new_token_share(T, n, r);
      for (int64_t i = 0; i < share; ++i) place.q_pos[r].push_back(next++);
      place.kv_pos[r].insert(place.kv_pos[r].end(), place.q_pos[r].begin(), place.q_pos[r].end());
    }
    std::vector<int64_t> positions(T);
    for (int64_t i = 0; i < T; ++i) positions[i] = begin + i;
    Tensor rc = rope(positions);
    x = embed(tokens.subspan(c0, T), *ctx.tp);  // (1, T, d), replicated
    ParallelConfig pass = ctx.config;
    pass.strategy = chunk.strategy;
    pass.schedule = chunk.schedule;
    for (Layer& layer : layers_) layer_forward(layer, x, rc, ctx, nullptr, &place, pass);
    turn.length += T;
    chunk.seconds = now_seconds() - tc;
    turn.out.chunks.push_back(std::move(chunk));
  }
  return x;
}

void Decoder::take_logits(const Tensor& x, Turn& turn) {
  const int64_t d = m_.hidden;
  Tensor last({d});
  std::memcpy(last.raw(), x.data<float>() + (x.dim(1) - 1) * d, d * sizeof(float));
  Output& out = turn.out;
  Tensor logits = logits_of(last, *turn.ctx.tp);
  out.tokens.push_back(argmax(logits));
  out.logits.push_back(std::move(logits));
  for (int64_t s : turn.opts.stop_tokens) out.stopped = out.stopped || s == out.tokens.back();
}

void Decoder::decode(Turn& turn, double t1) {
  // One token a step, pass-Q over the caches: the token chosen last enters at the cache's end,
  // owned by sequence-parallel rank (position mod N). The prompt's passes' storage, sized by its
  // tokens, goes back first (core/block_cache.h): the caches' growth takes its pages.
  block_cache::release();
  ParallelContext& ctx = turn.ctx;
  Output& out = turn.out;
  const int n = ctx.sp_size();
  const double before = out.decode_seconds;
  for (int64_t step = 1; step < turn.opts.max_new_tokens && !out.stopped; ++step) {
    const int64_t pos = turn.length++;
    const int owner = static_cast<int>(pos % n);
    for (auto& q : turn.place.q_pos) q.clear();
    turn.place.q_pos[owner].push_back(pos);
    turn.place.kv_pos[owner].push_back(pos);
    const int64_t position[1] = {pos};
    Tensor r1 = rope(position);
    Tensor h = embed(std::span<const int32_t>(&out.tokens.back(), 1), *ctx.tp);
    ParallelConfig pass = ctx.config;  // one new token: pass-Q, its queries all-gathered
    pass.strategy = Strategy::kPassQ;
    pass.schedule = ScheduleKind::kDefault;
    for (Layer& layer : layers_) layer_forward(layer, h, r1, ctx, nullptr, &turn.place, pass);
    take_logits(reshape(std::move(h), {1, 1, m_.hidden}), turn);
    out.decode_seconds = before + now_seconds() - t1;
    if (turn.opts.on_token)
      turn.opts.on_token(static_cast<int64_t>(out.tokens.size()), out.prefill_seconds,
                         out.decode_seconds);
  }
}

// ---- packed documents ------------------------------------------------------------------------

Placement Decoder::check_documents(const DecoderConfig& m, const ParallelConfig& c,
                                   const std::vector<std::vector<int32_t>>& prompts,
                                   bool allow_long_context, const DocumentNames& names) {
  const std::string_view parameter = names.prompts;
  SEQPAR_ARG_CHECK(!prompts.empty(), parameter, " holds no document; give at least one");
  std::vector<int64_t> lens;
  int64_t total = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int64_t len = static_cast<int64_t>(prompts[i].size());
    SEQPAR_ARG_CHECK(len >= 1, parameter, "[", i, "] is empty; every document needs at least ",
                     "one token id");
    for (size_t j = 0; j < prompts[i].size(); ++j)
      SEQPAR_ARG_CHECK(prompts[i][j] >= 0 && prompts[i][j] < m.vocab, parameter, "[", i, "] token ",
                       prompts[i][j], " at position ", j, " is outside the vocabulary (vocab_size ",
                       m.vocab, "); valid: 0 to ", m.vocab - 1);
    // Each document's positions restart at 0: a document, not the packed sequence, must fit.
    SEQPAR_ARG_CHECK(m.max_positions <= 0 || len <= m.max_positions || allow_long_context,
                     parameter, "[", i, "] holds ", len, " tokens, beyond max_position_embeddings ",
                     m.max_positions, " of ", m.name, " (each document's positions restart at 0); ",
                     "shorten it, or pass ", names.allow_long_context);
    total += len;
    SEQPAR_ARG_CHECK(total <= limits::kMaxTokens, parameter, " holds more than ",
                     limits::kMaxTokens, " tokens together; valid: at most that many");
    lens.push_back(len);
  }
  // The sequence-parallel group's view of the call, as attend() makes it (heads after tp).
  ParallelConfig group = c;
  group.mesh = {1, 1, c.mesh.ring, c.mesh.ulysses};
  if (group.sp() == 1) {  // one rank attends locally (model_context)
    group.strategy = Strategy::kLocal;
    group.schedule = ScheduleKind::kDefault;
    group.softmax = SoftmaxMode::kOnline;
  }
  AttnShape shape = group_call(m, c.mesh.tp);
  shape.seq = total;
  shape.seq_lens = lens;
  SEQPAR_ARG_CHECK(group.sp() <= total, parameter, " holds ", total, " tokens in ", lens.size(),
                   " documents, fewer than the ", group.sp(), " sequence-parallel ranks; every ",
                   "rank needs a token: use at most ", total, " ranks, or more tokens");
  try {
    validate_config(group, shape);
    return place_call(group, shape);
  } catch (const ParamError& e) {  // the strategy's or the layout's refusal, said of prompts
    throw ParamError(
        e.parameter(), e.expected(),
        detail::concat(parameter, " (", lens.size(), " packed documents, ", total, " tokens) on ",
                       group.sp(), " sequence-parallel ranks: ", e.marked()));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(detail::concat(parameter, " (", lens.size(), " packed documents, ", total,
                                         " tokens) on ", group.sp(),
                                         " sequence-parallel ranks: ", e.what()));
  }
}

Decoder::DocumentsOutput Decoder::prefill_documents(
    const std::vector<std::vector<int32_t>>& prompts, ParallelContext& ctx, bool all_logits) {
  const double t0 = now_seconds();
  const Placement place = check_documents(m_, ctx.config, prompts);
  const Partition& part = place.part;
  const int64_t d = m_.hidden, hd = m_.head_dim;
  std::vector<int64_t> lens;
  std::vector<int32_t> tokens;
  for (const auto& p : prompts) {
    lens.push_back(static_cast<int64_t>(p.size()));
    tokens.insert(tokens.end(), p.begin(), p.end());
  }
  const int64_t total = static_cast<int64_t>(tokens.size());
  const std::vector<int64_t> cu = cu_seqlens(lens);
  // This rank's rows: its positions of the packed sequence, ascending (padding, >= total, last);
  // each token's RoPE position is its offset inside its document.
  const std::span<const int64_t> mine = part.positions(ctx.sp_rank());
  const int64_t n = static_cast<int64_t>(mine.size());
  std::vector<int32_t> own;
  std::vector<int64_t> rope_pos(n, 0);  // padding rows: position 0 (masked, dropped)
  for (int64_t i = 0; i < n; ++i) {
    if (mine[i] >= total) continue;
    own.push_back(tokens[mine[i]]);
    rope_pos[i] = mine[i] - cu[document_of(cu, mine[i])];
  }
  Tensor x({1, n, d});  // padding rows zero
  const Tensor e = embed(own, *ctx.tp);
  std::memcpy(x.raw(), e.raw(), e.nbytes());
  const Tensor table = rope(rope_pos);  // (n, hd/2, 2)
  SEQPAR_CHECK(table.numel() == n * hd, "rope table of ", n, " rows");
  const AttendOver over = AttendOver::documents(part, lens);
  for (Layer& layer : layers_)
    layer_forward(layer, x, table, ctx, nullptr, nullptr, ctx.config, &over);
  // The last layer's rows of every rank, back in token order (padding dropped): (total, d).
  Communicator& sp = ctx.sp->sp();
  std::vector<size_t> counts(sp.size());
  for (int r = 0; r < sp.size(); ++r)
    counts[r] = static_cast<size_t>(part.count(r) * d) * sizeof(float);
  std::vector<float> rows(static_cast<size_t>(part.seq() * d));
  sp.all_gatherv(x.raw(), rows.data(), counts);
  Tensor h({total, d});
  const float* src = rows.data();
  for (int r = 0; r < sp.size(); ++r)
    for (int64_t p : part.positions(r)) {
      if (p < total) std::memcpy(h.data<float>() + p * d, src, d * sizeof(float));
      src += d;
    }
  // Each document's last row (or every row) through norm and lm_head.
  DocumentsOutput out;
  const size_t D = prompts.size();
  Tensor last({static_cast<int64_t>(D), d});
  for (size_t i = 0; i < D; ++i)
    std::memcpy(last.data<float>() + i * d, h.data<float>() + (cu[i + 1] - 1) * d,
                d * sizeof(float));
  const Tensor logits = logits_of(last, *ctx.tp);  // (D, vocab)
  const int64_t V = m_.vocab;
  for (size_t i = 0; i < D; ++i) {
    Tensor row({V});
    std::memcpy(row.raw(), logits.data<float>() + i * V, V * sizeof(float));
    out.tokens.push_back(argmax(row));
    out.logits.push_back(std::move(row));
  }
  if (all_logits) {
    const Tensor every = logits_of(h, *ctx.tp);  // (total, vocab)
    for (size_t i = 0; i < D; ++i) {
      Tensor doc({lens[i], V});
      std::memcpy(doc.raw(), every.data<float>() + cu[i] * V, lens[i] * V * sizeof(float));
      out.all_logits.push_back(std::move(doc));
    }
  }
  out.prefill_seconds = now_seconds() - t0;
  return out;
}

}  // namespace seqpar
