// The one entry point (cp_attention.h) and the strategies on strided views: q from (B, H, S, D)
// memory, k and v as head slices of one fused (B, S, 2·Hkv, D) tensor, the output written into
// (B, H, S, D) memory and the lse into rows of a larger buffer. Oracle: the reference on the
// unsharded tensors within the kernel's bound; and the entry point on dense tensors, which must
// give the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "parallel/cp_test_util.h"
#include "seqpar/core/tensor_view.h"
#include "seqpar/parallel/cp_attention.h"

namespace seqpar {
namespace {

using seqpar::testing::Problem;

// x (B, S, H, D) copied by hand into (B, H, S, D) memory.
Tensor head_first(const Tensor& x) {
  const int64_t B = x.dim(0), S = x.dim(1), H = x.dim(2), D = x.dim(3);
  Tensor t({B, H, S, D}, x.dtype());
  const size_t e = dtype_size(x.dtype());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        std::memcpy(static_cast<char*>(t.raw()) + (((b * H + h) * S + s) * D) * e,
                    static_cast<const char*>(x.raw()) + (((b * S + s) * H + h) * D) * e, D * e);
  return t;
}

// k and v (B, S, Hkv, D) side by side by heads: (B, S, 2·Hkv, D).
Tensor fused(const Tensor& k, const Tensor& v) {
  const int64_t B = k.dim(0), S = k.dim(1), H = k.dim(2), D = k.dim(3);
  Tensor t({B, S, 2 * H, D}, k.dtype());
  const size_t row = H * D * dtype_size(k.dtype());
  for (int64_t i = 0; i < B * S; ++i) {
    std::memcpy(static_cast<char*>(t.raw()) + 2 * i * row,
                static_cast<const char*>(k.raw()) + i * row, row);
    std::memcpy(static_cast<char*>(t.raw()) + (2 * i + 1) * row,
                static_cast<const char*>(v.raw()) + i * row, row);
  }
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// (strategy, schedule, ranks, dtype)
using Param = std::tuple<Strategy, ScheduleKind, int, DType>;
std::string param_name(const Param& p) {
  return std::string(strategy_name(std::get<0>(p))) +
         (std::get<1>(p) == ScheduleKind::kSteal ? "_steal_" : "_") +
         std::to_string(std::get<2>(p)) + "_" + std::string(dtype_name(std::get<3>(p)));
}
class DoorViews : public ::testing::TestWithParam<Param> {};

TEST_P(DoorViews, StridedInputsAndOutputs) {
  const auto [strategy, schedule, ranks, dtype] = GetParam();
  Problem p;
  p.batch = 2;
  p.seq = 53;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 16;
  p.causal = true;
  p.dtype = dtype;
  const auto& in = seqpar::testing::inputs_for(p);
  const Partition part(p.seq, ranks, Layout::kContiguous);
  CpOptions opts;
  opts.causal = true;
  opts.schedule = schedule;
  const AttnJob job = seqpar::testing::job_for(strategy, seqpar::testing::shape_of(p), part, opts,
                                               uses_ulysses(strategy) ? 2 : 0);
  std::vector<Tensor> outs(ranks), lses(ranks);
  ThreadWorld::run(ranks, [&](Communicator& comm) {
    const int r = comm.rank();
    const Tensor q = shard(in.q, part, r), k = shard(in.k, part, r), v = shard(in.v, part, r);
    const int64_t n = q.dim(1);
    JobComms comms(comm, job);
    AttnOutputs dense;
    attention(job.config, job.shape, comms.sp(), job.place, {q, k, v}, dense, nullptr, job.kernel);

    const Tensor q_hf = head_first(q), kv = fused(k, v);
    const AttnInputs strided{TensorView(q_hf).transpose(1, 2),
                             TensorView(kv).narrow(2, 0, p.kv_heads),
                             TensorView(kv).narrow(2, p.kv_heads, p.kv_heads)};
    Tensor out_hf({p.batch, p.heads, n, p.head_dim}), lse_rows({p.batch, n + 3, p.heads});
    lse_rows.fill(-5.f);
    AttnOutputs into;
    into.out_into = MutableTensorView(out_hf).transpose(1, 2);
    into.lse_into = MutableTensorView(lse_rows).narrow(1, 2, n);
    CpStats stats;
    attention(job.config, job.shape, comms.sp(), job.place, strided, into, &stats, job.kernel);
    EXPECT_TRUE(into.out.empty() && into.lse.empty()) << "rank " << r;
    EXPECT_EQ(stats.input_addresses[0], q_hf.raw());  // handed to the strategy as it lies
    outs[r] = into.out_into.contiguous();
    lses[r] = into.lse_into.contiguous();
    EXPECT_TRUE(same_bits(outs[r], dense.out)) << "rank " << r;
    EXPECT_TRUE(same_bits(lses[r], dense.lse)) << "rank " << r;
    lses[r].resize({p.batch, n, p.heads, 1});  // sharded like a (B, n, H, 1) tensor
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t s : {int64_t{0}, int64_t{1}, n + 2})
        for (int64_t h = 0; h < p.heads; ++h)
          EXPECT_EQ(lse_rows.at((b * (n + 3) + s) * p.heads + h), -5.f) << "rank " << r;
  });
  const ErrorBound tol = seqpar::testing::bound_for(p);
  EXPECT_LE(max_abs_diff(unshard(outs, part), in.ref.out), tol.out);
  Tensor lse = unshard(lses, part);
  lse.resize({p.batch, p.seq, p.heads});
  EXPECT_LE(max_abs_diff(lse, in.ref.lse), tol.lse);
}

// x (B, S, H, D) then y (B, T, H, D) along the sequence.
Tensor cat_tokens(const Tensor& x, const Tensor& y) {
  const int64_t B = x.dim(0), S = x.dim(1), T = y.dim(1);
  const size_t row = x.dim(2) * x.dim(3) * dtype_size(x.dtype());
  Tensor t({B, S + T, x.dim(2), x.dim(3)}, x.dtype());
  char* dst = static_cast<char*>(t.raw());
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(dst + b * (S + T) * row, static_cast<const char*>(x.raw()) + b * S * row, S * row);
    std::memcpy(dst + (b * (S + T) + S) * row, static_cast<const char*>(y.raw()) + b * T * row,
                T * row);
  }
  return t;
}

// Joint attention (text on every rank) with the image as above and the text as rows 1 .. 1 + T
// of larger tensors (rows apart in memory for B = 2), the text's output and lse written into rows
// of larger buffers: the reference over [image; text], and the same bits as dense tensors.
TEST(DoorViews, JointTextRowsInPlace) {
  Problem p;
  p.batch = 2;
  p.seq = 40;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 16;
  const int64_t T = 7;
  const auto& in = seqpar::testing::inputs_for(p);
  std::mt19937 rng(5);
  const Tensor tq = seqpar::testing::random_tensor({p.batch, T + 3, p.heads, p.head_dim}, rng,
                                                   DType::kF32),
               tk = seqpar::testing::random_tensor({p.batch, T + 3, p.kv_heads, p.head_dim}, rng,
                                                   DType::kF32),
               tv = seqpar::testing::random_tensor({p.batch, T + 3, p.kv_heads, p.head_dim}, rng,
                                                   DType::kF32);
  const TensorView tqv = TensorView(tq).narrow(1, 1, T), tkv = TensorView(tk).narrow(1, 1, T),
                   tvv = TensorView(tv).narrow(1, 1, T);
  const AttnState want =
      reference_attention(cat_tokens(in.q, tqv.contiguous()), cat_tokens(in.k, tkv.contiguous()),
                          cat_tokens(in.v, tvv.contiguous()));
  const Tensor want_image = TensorView(want.out).narrow(1, 0, p.seq).contiguous();
  const Tensor want_text = TensorView(want.out).narrow(1, p.seq, T).contiguous();
  const double vmax = std::max(seqpar::testing::max_abs(in.v), seqpar::testing::max_abs(tv));
  const ErrorBound tol = attention_error_bound(DType::kF32, p.seq + T, p.head_dim, vmax);
  for (auto [strategy, ranks] : {std::pair{Strategy::kRing, 2}, std::pair{Strategy::kAllGather, 3},
                                 std::pair{Strategy::kUlysses, 2}, std::pair{Strategy::kUsp, 4}}) {
    const Partition part(p.seq, ranks, Layout::kContiguous);
    AttnJob job = seqpar::testing::job_for(strategy, seqpar::testing::shape_of(p), part,
                                           CpOptions{}, uses_ulysses(strategy) ? 2 : 0);
    job.shape.text_tokens = T;
    std::vector<Tensor> outs(ranks);
    ThreadWorld::run(ranks, [&](Communicator& comm) {
      const int r = comm.rank();
      const Tensor q = shard(in.q, part, r), k = shard(in.k, part, r), v = shard(in.v, part, r);
      const int64_t n = q.dim(1);
      JobComms comms(comm, job);
      AttnOutputs dense;
      attention(job.config, job.shape, comms.sp(), job.place,
                {q, k, v, tqv.contiguous(), tkv.contiguous(), tvv.contiguous()}, dense);
      const Tensor q_hf = head_first(q), kv = fused(k, v);
      Tensor text_out({p.batch, T + 2, p.heads, p.head_dim}), text_lse({p.batch, T + 2, p.heads});
      AttnOutputs into;
      into.text_out_into = MutableTensorView(text_out).narrow(1, 2, T);
      into.text_lse_into = MutableTensorView(text_lse).narrow(1, 2, T);
      attention(job.config, job.shape, comms.sp(), job.place,
                {TensorView(q_hf).transpose(1, 2), TensorView(kv).narrow(2, 0, p.kv_heads),
                 TensorView(kv).narrow(2, p.kv_heads, p.kv_heads), tqv, tkv, tvv},
                into);
      const std::string where = std::string(strategy_name(strategy)) + " rank " +
                                std::to_string(r) + " of " + std::to_string(ranks);
      EXPECT_TRUE(same_bits(into.out, dense.out)) << where;
      EXPECT_TRUE(same_bits(into.text_out_into.contiguous(), dense.text_out)) << where;
      EXPECT_TRUE(same_bits(into.text_lse_into.contiguous(), dense.text_lse)) << where;
      EXPECT_LE(max_abs_diff(into.text_out_into.contiguous(), want_text), tol.out) << where;
      EXPECT_EQ(n, part.count(r));
      outs[r] = std::move(into.out);
    });
    EXPECT_LE(max_abs_diff(unshard(outs, part), want_image), tol.out) << strategy_name(strategy);
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, DoorViews,
    ::testing::Values(Param{Strategy::kRing, ScheduleKind::kDefault, 2, DType::kF32},
                      Param{Strategy::kRing, ScheduleKind::kDefault, 3, DType::kBF16},
                      Param{Strategy::kRing, ScheduleKind::kSteal, 4, DType::kF32},
                      Param{Strategy::kAllGather, ScheduleKind::kDefault, 3, DType::kF32},
                      Param{Strategy::kUlysses, ScheduleKind::kDefault, 2, DType::kBF16},
                      Param{Strategy::kUsp, ScheduleKind::kDefault, 4, DType::kF32}),
    [](const ::testing::TestParamInfo<Param>& i) { return param_name(i.param); });

}  // namespace
}  // namespace seqpar
