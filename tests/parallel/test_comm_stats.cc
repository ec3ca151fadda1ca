// Measured CommStats of every strategy equal the formulas of docs/algorithms.md exactly.
#include <gtest/gtest.h>

#include "parallel/cp_test_util.h"

namespace seqpar {

using seqpar::testing::Problem;
using seqpar::testing::run_cp;

class CommBytes
    : public ::testing::TestWithParam<std::tuple<Strategy, Layout, int, int64_t, int, DType>> {};

TEST_P(CommBytes, EqualFormula) {
  auto [strategy, layout, ranks, seq, batch, dtype] = GetParam();
  Problem p;
  p.seq = seq;
  p.batch = batch;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 16;
  p.dtype = dtype;
  p.causal = true;
  auto run = run_cp(p, strategy, layout, ranks);
  Partition part(seq, ranks, layout);
  for (int r = 0; r < ranks; ++r) {
    CommPrediction want = predict_comm_bytes(strategy, part, r, batch, p.heads, p.kv_heads,
                                             p.head_dim, dtype_size(dtype));
    EXPECT_EQ(run.comm[r].total_sent(), want.sent) << "rank " << r;
    EXPECT_EQ(run.comm[r].total_recv(), want.recv) << "rank " << r;
    // Which ops carry the bytes: ring only point-to-point, allgather only all-gathers.
    const OpKind kind = strategy == Strategy::kRing ? OpKind::kSendRecv : OpKind::kAllGather;
    EXPECT_EQ(run.comm[r].bytes_sent[static_cast<size_t>(kind)], want.sent);
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, CommBytes,
    ::testing::Combine(::testing::Values(Strategy::kAllGather, Strategy::kRing),
                       ::testing::Values(Layout::kContiguous, Layout::kStriped, Layout::kZigzag),
                       ::testing::Values(1, 2, 3, 4, 8), ::testing::Values(int64_t{64}, int64_t{67}),
                       ::testing::Values(1, 2), ::testing::Values(DType::kF32, DType::kBF16)));

TEST(CommBytes, EvenFormulaOfDesign) {
  // 2·S·Hkv·D·e·(N-1)/N per rank for both strategies when S divides.
  const int64_t S = 1024, Hkv = 2, D = 16, e = 4;
  for (int n : {2, 4, 8}) {
    Partition part(S, n, Layout::kContiguous);
    for (Strategy s : {Strategy::kAllGather, Strategy::kRing}) {
      auto p = predict_comm_bytes(s, part, 0, 1, 4, Hkv, D, e);
      EXPECT_EQ(p.sent, static_cast<uint64_t>(2 * S * Hkv * D * e * (n - 1) / n));
      EXPECT_EQ(p.recv, p.sent);
    }
  }
}

}  // namespace seqpar
