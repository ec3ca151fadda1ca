#include "seqpar/model/qwen_image.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "seqpar/core/param_error.h"
#include "seqpar/model/blocks/modulation.h"
#include "seqpar/model/ops.h"

namespace seqpar {

namespace {
constexpr int64_t kTimeChannels = 256;  // Timesteps(num_channels=256, scale=1000)
constexpr float kTimeScale = 1000.0f;

AttentionSpec qwen_attention(const QwenImageConfig& m) {
  AttentionSpec a;
  a.hidden = m.hidden;
  a.heads = a.kv_heads = m.heads;
  a.head_dim = m.head_dim;
  a.qkv_bias = a.o_bias = true;
  a.qk_norm = QkNorm::kPerHead;
  a.qk_norm_eps = static_cast<float>(m.eps);
  a.rope_pairs = RopePairs::kInterleaved;  // view_as_complex of (.., D/2, 2)
  return a;
}

// The fp32 angles diffusers' rope_params gives position `pos` on an axis of `dim` features:
// pos · (1 / theta^(2k/dim)), each step rounded to fp32.
void axis_angles(int64_t pos, int64_t dim, double theta, float* out) {
  for (int64_t k = 0; k < dim / 2; ++k) {
    const float e = static_cast<float>(2 * k) / static_cast<float>(dim);
    const float inv = 1.0f / static_cast<float>(std::pow(theta, static_cast<double>(e)));
    out[k] = static_cast<float>(pos) * inv;
  }
}

void write_row(Tensor& t, int64_t row, std::array<int64_t, 3> pos, std::array<int64_t, 3> axes,
               double theta) {
  const int64_t pairs = (axes[0] + axes[1] + axes[2]) / 2;
  std::vector<float> angles(pairs);
  int64_t j = 0;
  for (int a = 0; a < 3; ++a) {
    axis_angles(pos[a], axes[a], theta, angles.data() + j);
    j += axes[a] / 2;
  }
  float* cs = t.data<float>() + row * pairs * 2;
  for (int64_t p = 0; p < pairs; ++p) {
    cs[2 * p] = std::cos(angles[p]);
    cs[2 * p + 1] = std::sin(angles[p]);
  }
}
}  // namespace

AttentionSpec QwenImageConfig::image_attention() const {
  AttentionSpec a = qwen_attention(*this);
  a.proj = {"to_q", "to_k", "to_v", "to_out.0"};
  a.norm = {"norm_q", "norm_k"};
  return a;
}

AttentionSpec QwenImageConfig::text_attention() const {
  AttentionSpec a = qwen_attention(*this);
  a.proj = {"add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"};
  a.norm = {"norm_added_q", "norm_added_k"};
  return a;
}

QwenImageRope qwen_image_rope(std::span<const std::array<int64_t, 3>> images, int64_t text_len,
                              std::array<int64_t, 3> axes, double theta) {
  const int64_t pairs = (axes[0] + axes[1] + axes[2]) / 2;
  int64_t S = 0, text_start = 0;
  for (const auto& [f, h, w] : images) {
    S += f * h * w;
    text_start = std::max({text_start, h / 2, w / 2});
  }
  QwenImageRope r{Tensor({S, pairs, 2}), Tensor({text_len, pairs, 2})};
  int64_t row = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    const auto [F, H, W] = images[i];
    // scale_rope: rows -(H - H/2) .. H/2 - 1, columns likewise, frames from the image's index.
    for (int64_t f = 0; f < F; ++f)
      for (int64_t y = 0; y < H; ++y)
        for (int64_t x = 0; x < W; ++x)
          write_row(r.image, row++, {static_cast<int64_t>(i) + f, y - (H - H / 2), x - (W - W / 2)},
                    axes, theta);
  }
  for (int64_t j = 0; j < text_len; ++j)
    write_row(r.text, j, {text_start + j, text_start + j, text_start + j}, axes, theta);
  return r;
}

std::vector<WeightStore::Spec> QwenImage::parameters(const QwenImageConfig& m) {
  const int64_t d = m.hidden;
  std::vector<WeightStore::Spec> p = {
      {"img_in.weight", {d, m.in_channels}},
      {"img_in.bias", {d}, 0},
      {"txt_norm.weight", {m.text_dim}, -1},
      {"txt_in.weight", {d, m.text_dim}},
      {"txt_in.bias", {d}, 0},
      {"time_text_embed.timestep_embedder.linear_1.weight", {d, kTimeChannels}},
      {"time_text_embed.timestep_embedder.linear_1.bias", {d}, 0},
      {"time_text_embed.timestep_embedder.linear_2.weight", {d, d}},
      {"time_text_embed.timestep_embedder.linear_2.bias", {d}, 0},
  };
  auto append = [&](std::vector<WeightStore::Spec> more) {
    p.insert(p.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  };
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string b = "transformer_blocks." + std::to_string(i) + ".";
    for (const char* stream : {"img", "txt"}) {
      p.push_back({b + stream + "_mod.1.weight", {6 * d, d}});
      p.push_back({b + stream + "_mod.1.bias", {6 * d}, 0});
      append(FeedForward::parameters(b + stream + "_mlp", FeedForward::Kind::kGeluTanh, d,
                                     m.ffn_dim, true, 0));
    }
    append(m.image_attention().parameters(b + "attn", 0.02f, 0));
    append(m.text_attention().parameters(b + "attn", 0.02f, 0));
  }
  append({{"norm_out.linear.weight", {2 * d, d}},
          {"norm_out.linear.bias", {2 * d}, 0},
          {"proj_out.weight", {m.out_features(), d}},
          {"proj_out.bias", {m.out_features()}, 0}});
  return p;
}

const SpPlan& QwenImage::sp_plan() {
  static const SpPlan plan = {
      {"transformer_blocks.0", SpAction::kShard, {"hidden", "rope"}},
      {"proj_out", SpAction::kGather, {"hidden"}},
      {"txt_in", SpAction::kReplicate, {"context"}},
  };
  return plan;
}

QwenImage::QwenImage(const QwenImageConfig& m, const WeightStore& ws, const ParallelContext& ctx)
    : m_(m) {
  const int tp = ctx.tp_size();
  SEQPAR_PARAM_CHECK(m.heads % tp == 0, "tp", "", param("tp"), " ", tp, " does not divide the ",
                     m.heads, " heads of ", m.name);
  img_in_ = Linear::load(ws, "img_in", true);
  txt_in_ = Linear::load(ws, "txt_in", true);
  txt_norm_ = RmsNorm::load(ws, "txt_norm", static_cast<float>(m.eps));
  time_fc1_ = Linear::load(ws, "time_text_embed.timestep_embedder.linear_1", true);
  time_fc2_ = Linear::load(ws, "time_text_embed.timestep_embedder.linear_2", true);
  norm_out_ = Linear::load(ws, "norm_out.linear", true);
  proj_out_ = Linear::load(ws, "proj_out", true);
  const IndexRange mods = tp_share(6 * m.hidden, ctx.tp_rank(), tp);  // captured: no binding
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string b = "transformer_blocks." + std::to_string(i) + ".";
    Block blk;
    auto stream = [&](const std::string& name) {
      return Stream{ColumnLinear::load(ws, b + name + "_mod.1", mods.begin, mods.end, true),
                    FeedForward::load(ws, b + name + "_mlp", FeedForward::Kind::kGeluTanh,
                                      m.ffn_dim, true, ctx)};
    };
    blk.image = stream("img");
    blk.text = stream("txt");
    blk.attn = JointAttention::load(ws, b + "attn", m.image_attention(), m.text_attention(), ctx,
                                    /*split_text_by_head=*/true);
    blocks_.push_back(std::move(blk));
  }
}

std::vector<float> QwenImage::modulation(const Stream& s, const Tensor& temb_act,
                                         Communicator& tp) const {
  const Tensor mine = s.mod.forward(temb_act);  // this rank's rows
  std::vector<float> all(6 * m_.hidden);
  if (tp.size() == 1) {
    std::copy_n(mine.data<float>(), mine.numel(), all.data());
  } else {
    tp.all_gather(mine.raw(), mine.nbytes(), all.data());
  }
  return all;
}

Tensor QwenImage::forward(const Tensor& hidden, std::span<const std::array<int64_t, 3>> images,
                          float t, const Tensor& text, ParallelContext& ctx) const {
  const int64_t d = m_.hidden, S = hidden.dim(1), L = text.dim(1);
  SpRuntime sp(sp_plan(), ctx, S);

  // Replicated on every rank: the embeddings of the image tokens, the text, the timestep, and
  // the RoPE tables.
  Tensor x = img_in_.forward(hidden);  // (1, S, d)
  Tensor temb = time_fc1_.forward(timestep_embedding(t, kTimeChannels, kTimeScale));
  silu_(temb);
  temb = time_fc2_.forward(temb);  // (d)
  Tensor temb_act = reshape(temb, {1, d});
  silu_(temb_act);
  Tensor c = sp.at("txt_in", "context", txt_in_.forward(txt_norm_.forward(text)));  // (1, L, d)
  QwenImageRope rope = qwen_image_rope(images, L, m_.axes_dims);
  Tensor rope_image = reshape(std::move(rope.image), {1, S, m_.head_dim});

  x = sp.at("transformer_blocks.0", "hidden", std::move(x));
  rope_image = sp.at("transformer_blocks.0", "rope", std::move(rope_image));
  const int64_t n = x.dim(1);
  rope_image = reshape(std::move(rope_image), {n, m_.head_dim / 2, 2});

  expect_finite(x, "img_in");
  expect_finite(c, "txt_in");
  expect_finite(temb, "time_text_embed");

  const LayerNorm plain = LayerNorm::plain(static_cast<float>(m_.eps));
  const int64_t last = static_cast<int64_t>(blocks_.size()) - 1;
  for (int64_t b = 0; b <= last; ++b) {
    const Block& blk = blocks_[b];
    // shift, scale, gate of the attention, then of the FFN, per stream.
    const std::vector<float> mi = modulation(blk.image, temb_act, *ctx.tp);
    const std::vector<float> mt = modulation(blk.text, temb_act, *ctx.tp);
    Tensor xi = plain.forward(x);
    modulate_(xi, &mi[0], &mi[d]);
    Tensor ct = plain.forward(c);
    modulate_(ct, &mt[0], &mt[d]);
    const JointAttention::Result a = blk.attn.forward(xi, ct, rope_image, rope.text, ctx, sp);
    expect_finite(a.image, "transformer_blocks", b, "attn");
    expect_finite(a.text, "transformer_blocks", b, "attn (text)");
    gated_add_(x, &mi[2 * d], a.image);
    gated_add_(c, &mt[2 * d], a.text);
    xi = plain.forward(x);
    modulate_(xi, &mi[3 * d], &mi[4 * d]);
    const Tensor fi = blk.image.ffn.forward(xi, *ctx.tp);
    expect_finite(fi, "transformer_blocks", b, "img_mlp");
    gated_add_(x, &mi[5 * d], fi);
    expect_finite(x, "transformer_blocks", b, "img_mlp's residual add");
    if (b == last) break;  // the last block's text output reaches nothing
    ct = plain.forward(c);
    modulate_(ct, &mt[3 * d], &mt[4 * d]);
    const Tensor ft = blk.text.ffn.forward(ct, *ctx.tp);
    expect_finite(ft, "transformer_blocks", b, "txt_mlp");
    gated_add_(c, &mt[5 * d], ft);
    expect_finite(c, "transformer_blocks", b, "txt_mlp's residual add");
  }

  // AdaLayerNormContinuous: scale, then shift.
  const Tensor so = norm_out_.forward(temb_act);
  Tensor y = plain.forward(x);
  modulate_(y, so.data<float>() + d, so.data<float>());
  y = proj_out_.forward(y);  // (1, n, p·p·C)
  expect_finite(y, "proj_out");
  return sp.at("proj_out", "hidden", std::move(y));
}

}  // namespace seqpar
