// const-max softmax for the ring (docs/algorithms.md "const-max ring"): against
// reference_attention over ranks x layouts x causal x GQA x uneven lengths; loose bounds (one
// huge-norm key) falling back and staying right; the same result whatever order the partial
// sums are added in; the measured bytes equal the formula.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "parallel/cp_test_util.h"
#include "strategy_common.h"

namespace seqpar {
namespace {

using seqpar::testing::inputs_for;
using seqpar::testing::max_err_lse;
using seqpar::testing::Problem;
using seqpar::testing::run_cp;

using seqpar::testing::bound_for;

// Inputs with a key many times longer than the rest (logits far from unit scale, beyond what
// attention_error_bound assumes) keep a fixed tolerance.
constexpr double kTolF32 = 1e-4;

CpOptions const_max_options() {
  CpOptions o;
  o.softmax = SoftmaxMode::kConstMax;
  return o;
}

int64_t total_fallback(const std::vector<CpStats>& cp) {
  int64_t n = 0;
  for (const CpStats& c : cp) n += c.fallback_rows;
  return n;
}

// (layout, ranks, causal, (heads, kv_heads), seq)
using SweepParam = std::tuple<Layout, int, bool, std::pair<int, int>, int64_t>;
class ConstMaxSweep : public ::testing::TestWithParam<SweepParam> {};

TEST_P(ConstMaxSweep, MatchesReference) {
  auto [layout, ranks, causal, hk, seq] = GetParam();
  Problem p;  // the same problems as StrategySweep: inputs and reference are shared
  p.seq = seq;
  p.heads = hk.first;
  p.kv_heads = hk.second;
  p.head_dim = 64;
  p.causal = causal;
  auto run = run_cp(p, Strategy::kRing, layout, ranks, const_max_options());
  const auto& ref = inputs_for(p).ref;
  EXPECT_LE(max_abs_diff(run.state.out, ref.out), bound_for(p).out);
  EXPECT_LE(max_err_lse(run.state.lse, ref.lse), bound_for(p).lse);
  // Unit-variance inputs: every bound is within the limit of the first block's lse.
  EXPECT_EQ(total_fallback(run.cp), 0);
}

std::string sweep_name(const ::testing::TestParamInfo<SweepParam>& info) {
  auto [layout, ranks, causal, hk, seq] = info.param;
  return std::string(layout_name(layout)) + "_n" + std::to_string(ranks) +
         (causal ? "_causal" : "_full") + "_h" + std::to_string(hk.first) + "kv" +
         std::to_string(hk.second) + "_s" + std::to_string(seq);
}

INSTANTIATE_TEST_SUITE_P(
    Small, ConstMaxSweep,
    ::testing::Combine(::testing::Values(Layout::kContiguous, Layout::kStriped, Layout::kZigzag),
                       ::testing::Values(1, 2, 3, 4, 8), ::testing::Bool(),
                       ::testing::Values(std::pair{4, 4}, std::pair{4, 1}, std::pair{6, 3}),
                       ::testing::Values(int64_t{37}, int64_t{300})),
    sweep_name);

INSTANTIATE_TEST_SUITE_P(Uneven, ConstMaxSweep,
                         ::testing::Combine(::testing::Values(Layout::kZigzag),
                                            ::testing::Values(3, 8), ::testing::Bool(),
                                            ::testing::Values(std::pair{2, 1}),
                                            ::testing::Values(int64_t{3817})),
                         sweep_name);

TEST(ConstMax, UspRingPart) {
  Problem p;
  p.seq = 300;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 64;
  for (bool causal : {false, true}) {
    p.causal = causal;
    for (int u : {1, 2, 4}) {
      auto run = run_cp(p, Strategy::kUsp, Layout::kZigzag, 4, const_max_options(), u);
      EXPECT_LE(max_abs_diff(run.state.out, inputs_for(p).ref.out), bound_for(p).out) << "U " << u;
      EXPECT_LE(max_err_lse(run.state.lse, inputs_for(p).ref.lse), bound_for(p).lse) << "U " << u;
      EXPECT_EQ(total_fallback(run.cp), 0);
    }
  }
}

TEST(ConstMax, Bf16InputsWithinTolerance) {
  Problem p;
  p.seq = 200;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 64;
  p.dtype = DType::kBF16;
  p.causal = true;
  auto run = run_cp(p, Strategy::kRing, Layout::kContiguous, 4, const_max_options());
  EXPECT_LE(max_abs_diff(run.state.out, inputs_for(p).ref.out), bound_for(p).out);
  EXPECT_LE(max_err_lse(run.state.lse, inputs_for(p).ref.lse), bound_for(p).lse);
  EXPECT_EQ(total_fallback(run.cp), 0);
}

TEST(ConstMax, OnlineReportsNoFallback) {
  Problem p;
  p.seq = 37;
  auto run = run_cp(p, Strategy::kRing, Layout::kZigzag, 3);
  EXPECT_EQ(total_fallback(run.cp), 0);
}

// ---- custom inputs: huge-norm keys, ring direction ----------------------------------------

struct Global {
  Tensor q, k, v;
  AttnState ref;
  bool causal = false;
};

Global random_global(int64_t b, int64_t s, int64_t h, int64_t hkv, int64_t d, bool causal,
                     uint32_t seed) {
  std::mt19937 rng(seed);
  Global g;
  g.q = seqpar::testing::random_tensor({b, s, h, d}, rng, DType::kF32);
  g.k = seqpar::testing::random_tensor({b, s, hkv, d}, rng, DType::kF32);
  g.v = seqpar::testing::random_tensor({b, s, hkv, d}, rng, DType::kF32);
  g.causal = causal;
  return g;
}

void compute_reference(Global& g) {
  AttnParams params;
  params.mask.causal = g.causal;
  g.ref = reference_attention(g.q, g.k, g.v, params);
}

struct RingRun {
  AttnState state;
  std::vector<CpStats> cp;
};

// The ring on every rank of `part`; reversed: over a communicator whose member order is the
// reverse of the ranks', so K/V travel the other way and every rank adds the blocks in the
// opposite order (its own first either way).
RingRun run_ring(const Global& g, const Partition& part, CpOptions opts, bool reversed) {
  opts.causal = g.causal;
  const int n = part.ranks();
  std::vector<Tensor> outs(n), lses(n);
  RingRun result;
  result.cp.resize(n);
  ThreadWorld::run(n, [&](Communicator& comm) {
    const int r = comm.rank();
    Tensor q = shard(g.q, part, r), k = shard(g.k, part, r), v = shard(g.v, part, r);
    AttnState s;
    if (!reversed) {
      s = ring_attention(comm, part, q, k, v, opts, &result.cp[r]);
    } else {
      std::unique_ptr<Communicator> rev = comm.split(0, n - 1 - r);
      std::vector<std::span<const int64_t>> blocks(n);
      for (int i = 0; i < n; ++i) blocks[i] = part.positions(n - 1 - i);
      s = ring_over_blocks(*rev, blocks, part.positions(r), q, k, v, opts, &result.cp[r]);
    }
    outs[r] = std::move(s.out);
    lses[r] = std::move(s.lse);
    lses[r].resize({g.q.dim(0), part.count(r), g.q.dim(2), 1});
  });
  result.state.out = unshard(outs, part);
  result.state.lse = unshard(lses, part);
  result.state.lse.resize({g.q.dim(0), g.q.dim(1), g.q.dim(2)});
  return result;
}

TEST(ConstMax, HugeNormKeyFallsBackAndStaysRight) {
  // One key of batch row 1, kv head 0 is 60x longer than the rest: the bound of every query row
  // of that (batch, kv head) is ~60x its logits, far beyond the limit, so exactly those rows
  // (2 query heads x S tokens) fall back; the other batch row and kv head are unaffected.
  const int64_t B = 2, S = 200, H = 4, Hkv = 2, D = 32;
  for (bool causal : {false, true}) {
    Global g = random_global(B, S, H, Hkv, D, causal, 7);
    float* key = g.k.data<float>() + ((1 * S + 77) * Hkv + 0) * D;
    for (int64_t x = 0; x < D; ++x) key[x] *= 60.f;
    compute_reference(g);
    for (Layout layout : {Layout::kContiguous, Layout::kZigzag}) {
      for (int ranks : {1, 4}) {
        Partition part(S, ranks, layout);
        RingRun run = run_ring(g, part, const_max_options(), false);
        EXPECT_LE(max_abs_diff(run.state.out, g.ref.out), kTolF32) << ranks << " causal " << causal;
        EXPECT_LE(max_err_lse(run.state.lse, g.ref.lse), kTolF32);
        EXPECT_EQ(total_fallback(run.cp), 2 * S) << ranks << " causal " << causal;
      }
    }
  }
}

TEST(ConstMax, SameResultForReversedRingDirection) {
  const int64_t B = 2, S = 301, H = 6, Hkv = 3, D = 32;
  for (bool huge : {false, true}) {
    Global g = random_global(B, S, H, Hkv, D, true, 11);
    if (huge) {  // mixed: fallback rows merge by LSE, the rest add sums
      float* key = g.k.data<float>() + ((0 * S + 250) * Hkv + 2) * D;
      for (int64_t x = 0; x < D; ++x) key[x] *= 40.f;
    }
    compute_reference(g);
    for (int ranks : {3, 8}) {
      Partition part(S, ranks, Layout::kZigzag);
      RingRun fwd = run_ring(g, part, const_max_options(), false);
      RingRun rev = run_ring(g, part, const_max_options(), true);
      EXPECT_LE(max_abs_diff(fwd.state.out, g.ref.out), kTolF32);
      EXPECT_LE(max_abs_diff(rev.state.out, g.ref.out), kTolF32);
      // The same sums in another order: equal up to fp32 rounding, far below the tolerance.
      EXPECT_LE(max_abs_diff(fwd.state.out, rev.state.out), 5e-6) << ranks;
      EXPECT_LE(max_err_lse(fwd.state.lse, rev.state.lse), 5e-6) << ranks;
      EXPECT_EQ(total_fallback(fwd.cp), total_fallback(rev.cp));
      EXPECT_EQ(total_fallback(fwd.cp) > 0, huge);
    }
  }
}

// ---- the accumulator alone: shuffled blocks, wrong bounds --------------------------------------

// Key block [k0, k0+n) of (B, S, Hkv, D).
Tensor key_block(const Tensor& t, int64_t k0, int64_t n) {
  const int64_t b = t.dim(0), s = t.dim(1), row = t.dim(2) * t.dim(3);
  Tensor out({b, n, t.dim(2), t.dim(3)});
  for (int64_t bi = 0; bi < b; ++bi)
    std::copy_n(t.data<float>() + (bi * s + k0) * row, n * row, out.data<float>() + bi * n * row);
  return out;
}

struct Blocks {
  std::vector<Tensor> k, v;
  std::vector<std::vector<int64_t>> pos;
};

Blocks split_keys(const Global& g, std::vector<int64_t> sizes) {
  Blocks bl;
  int64_t k0 = 0;
  for (int64_t n : sizes) {
    bl.k.push_back(key_block(g.k, k0, n));
    bl.v.push_back(key_block(g.v, k0, n));
    bl.pos.emplace_back(n);
    std::iota(bl.pos.back().begin(), bl.pos.back().end(), k0);
    k0 += n;
  }
  EXPECT_EQ(k0, g.k.dim(1));
  return bl;
}

// Attends g.q to the blocks in `order` (the first with the online softmax, the rest with the
// fixed max) through a ConstMaxAccumulator with `bounds`.
AttnState accumulate(const Global& g, const Blocks& bl, const std::vector<int>& order,
                     std::vector<float> bounds, int64_t* fallback) {
  std::vector<int64_t> q_pos(g.q.dim(1));
  std::iota(q_pos.begin(), q_pos.end(), 0);
  ConstMaxAccumulator acc(std::move(bounds));
  for (int i : order) {
    AttnParams params;
    params.mask.causal = g.causal;
    params.mask.q_pos = q_pos;
    params.mask.k_pos = bl.pos[i];
    if (acc.started()) {
      acc.prepare(params);
      acc.add(flash_attention(g.q, bl.k[i], bl.v[i], params));
    } else {
      acc.start(flash_attention(g.q, bl.k[i], bl.v[i], params));
    }
  }
  *fallback = acc.fallback_rows();
  return acc.finish();
}

std::vector<float> bounds_of(const Global& g) {
  std::vector<float> bounds;
  std::vector<int64_t> k_pos(g.k.dim(1));
  std::iota(k_pos.begin(), k_pos.end(), 0);
  ThreadWorld::run(1, [&](Communicator& comm) {
    bounds = const_max_row_bounds(comm, g.q, g.k, k_pos, CpOptions{});
  });
  return bounds;
}

TEST(ConstMaxAccumulator, ShuffledBlocksGiveTheSameResult) {
  Global g = random_global(2, 240, 4, 2, 32, false, 21);
  compute_reference(g);
  const Blocks bl = split_keys(g, {50, 17, 64, 1, 48, 60});
  const std::vector<float> bounds = bounds_of(g);
  std::vector<int> order(bl.k.size());
  std::iota(order.begin(), order.end(), 0);
  int64_t fb = -1;
  const AttnState first = accumulate(g, bl, order, bounds, &fb);
  EXPECT_EQ(fb, 0);
  EXPECT_LE(max_abs_diff(first.out, g.ref.out), kTolF32);
  EXPECT_LE(max_err_lse(first.lse, g.ref.lse), kTolF32);
  std::mt19937 rng(3);
  for (int trial = 0; trial < 4; ++trial) {
    std::shuffle(order.begin() + 1, order.end(), rng);  // same first block, any order after
    const AttnState s = accumulate(g, bl, order, bounds, &fb);
    EXPECT_EQ(fb, 0);
    EXPECT_LE(max_abs_diff(s.out, first.out), 5e-6) << trial;
    EXPECT_LE(max_err_lse(s.lse, first.lse), 5e-6) << trial;
  }
}

TEST(ConstMaxAccumulator, WrongBoundsAreCaughtAndStillRight) {
  // "Bounds" 15 below each row's log-sum-exp: accepted at the first block (within the limit of
  // its lse), then some later block's max exceeds them by more than the kernel's slack; those
  // rows are normalized and finish with the online merge.
  Global g = random_global(1, 200, 2, 1, 32, true, 5);
  compute_reference(g);
  const Blocks bl = split_keys(g, {40, 40, 40, 40, 40});
  std::vector<float> bounds(static_cast<size_t>(g.ref.lse.numel()));
  for (size_t i = 0; i < bounds.size(); ++i) bounds[i] = g.ref.lse.at(int64_t(i)) - 15.f;
  int64_t fb = 0;
  const AttnState s = accumulate(g, bl, {0, 1, 2, 3, 4}, bounds, &fb);
  EXPECT_GT(fb, 0);
  EXPECT_LE(max_abs_diff(s.out, g.ref.out), kTolF32);
  EXPECT_LE(max_err_lse(s.lse, g.ref.lse), kTolF32);
}

TEST(ConstMaxAccumulator, BoundsAreCauchySchwarz) {
  Global g = random_global(2, 50, 4, 2, 16, false, 9);
  const std::vector<float> bounds = bounds_of(g);
  const double scale = 0.25;  // 1/sqrt(16)
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 50; ++i)
      for (int64_t h = 0; h < 4; ++h) {
        double mx = 0;
        for (int64_t j = 0; j < 50; ++j) {
          double dot = 0;
          for (int64_t x = 0; x < 16; ++x)
            dot += double(g.q.at(((b * 50 + i) * 4 + h) * 16 + x)) *
                   g.k.at(((b * 50 + j) * 2 + h / 2) * 16 + x);
          mx = std::max(mx, scale * dot);
        }
        EXPECT_GE(bounds[(b * 50 + i) * 4 + h], mx * (1 - 1e-6));
      }
}

// ---- bytes and options -----------------------------------------------------------------------

class ConstMaxBytes : public ::testing::TestWithParam<std::tuple<Layout, int, int64_t, int>> {};

TEST_P(ConstMaxBytes, EqualFormula) {
  auto [layout, ranks, seq, batch] = GetParam();
  Problem p;
  p.seq = seq;
  p.batch = batch;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 16;
  p.causal = true;
  auto run = run_cp(p, Strategy::kRing, layout, ranks, const_max_options());
  Partition part(seq, ranks, layout);
  for (int r = 0; r < ranks; ++r) {
    CommPrediction want = predict_comm_bytes(Strategy::kRing, part, r, batch, p.heads, p.kv_heads,
                                             p.head_dim, 4, 0, 0, SoftmaxMode::kConstMax);
    CommPrediction online =
        predict_comm_bytes(Strategy::kRing, part, r, batch, p.heads, p.kv_heads, p.head_dim, 4);
    EXPECT_EQ(run.comm[r].total_sent(), want.sent) << "rank " << r;
    EXPECT_EQ(run.comm[r].total_recv(), want.recv) << "rank " << r;
    // The all-reduce (max) of B·Hkv fp32 key norms, on top of the K/V ring.
    const uint64_t norms = 4ull * batch * p.kv_heads * (ranks - 1);
    EXPECT_EQ(run.comm[r].bytes_sent[static_cast<size_t>(OpKind::kAllReduce)], norms);
    EXPECT_EQ(run.comm[r].bytes_recv[static_cast<size_t>(OpKind::kAllReduce)], norms);
    EXPECT_EQ(want.sent, online.sent + norms);
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, ConstMaxBytes,
    ::testing::Combine(::testing::Values(Layout::kContiguous, Layout::kStriped, Layout::kZigzag),
                       ::testing::Values(1, 2, 3, 4, 8), ::testing::Values(int64_t{67}),
                       ::testing::Values(1, 2)));

TEST(ConstMaxBytes, UspEqualFormula) {
  Problem p;
  p.seq = 67;
  p.batch = 2;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 16;
  p.causal = true;
  for (int u : {1, 2, 4}) {
    auto run = run_cp(p, Strategy::kUsp, Layout::kZigzag, 4, const_max_options(), u);
    Partition part(p.seq, 4, Layout::kZigzag);
    for (int r = 0; r < 4; ++r) {
      CommPrediction want =
          predict_comm_bytes(Strategy::kUsp, part, r, p.batch, p.heads, p.kv_heads, p.head_dim, 4,
                             u, 0, SoftmaxMode::kConstMax);
      EXPECT_EQ(run.comm[r].total_sent(), want.sent) << "U " << u << " rank " << r;
      EXPECT_EQ(run.comm[r].total_recv(), want.recv) << "U " << u << " rank " << r;
    }
  }
}

TEST(ConstMax, OnlyRingStrategiesAcceptIt) {
  EXPECT_EQ(parse_softmax_mode("const-max"), SoftmaxMode::kConstMax);
  EXPECT_EQ(parse_softmax_mode("online"), SoftmaxMode::kOnline);
  EXPECT_EQ(softmax_mode_name(SoftmaxMode::kConstMax), "const-max");
  EXPECT_THROW(parse_softmax_mode("fixed"), InvalidArgument);
  const CpOptions cm = const_max_options();
  EXPECT_NO_THROW(check_softmax_mode(Strategy::kRing, cm));
  EXPECT_NO_THROW(check_softmax_mode(Strategy::kUsp, cm));
  EXPECT_THROW(check_softmax_mode(Strategy::kAllGather, cm), InvalidArgument);
  EXPECT_THROW(check_softmax_mode(Strategy::kUlysses, cm), InvalidArgument);
  Problem p;
  p.seq = 16;
  EXPECT_THROW(run_cp(p, Strategy::kAllGather, Layout::kContiguous, 2, cm), InvalidArgument);
}

}  // namespace
}  // namespace seqpar
