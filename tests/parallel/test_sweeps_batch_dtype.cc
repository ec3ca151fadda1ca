// Every strategy and option (allgather, ring, ulysses, usp, const-max, passq, passkv, joint text,
// padding) x batch 1-3 x fp32/bf16/fp16 inputs x causal x layouts x ranks against
// reference_attention at the kernel path's error bound (cp_check.h). Small per case, wide in
// parameters: a regrouping bug that shows only with B > 1, or a dtype path a strategy
// mishandles, fails here.
#include <gtest/gtest.h>

#include "parallel/cp_check.h"

namespace seqpar {
namespace {

using seqpar::testing::check_on_threads;
using seqpar::testing::CheckCase;
using seqpar::testing::Kind;
using seqpar::testing::kinds;
using seqpar::testing::make_case;
using seqpar::testing::Op;

struct SweepPoint {
  CheckCase c;
  int ranks;
};

std::vector<SweepPoint> sweep_points() {
  std::vector<SweepPoint> v;
  const std::pair<int, Layout> placements[] = {
      {2, Layout::kZigzag}, {3, Layout::kStriped}, {3, Layout::kContiguous}, {4, Layout::kZigzag}};
  for (const Kind& kind : kinds())
    for (int64_t batch : {1, 2, 3})
      for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16})
        for (bool causal : {false, true}) {
          if (kind.op == Op::kJoint && causal) continue;  // joint attention is bidirectional
          for (auto [ranks, layout] : placements)
            v.push_back({make_case(kind, batch, dtype, causal, layout), ranks});
        }
  return v;
}

void PrintTo(const SweepPoint& p, std::ostream* os) {
  *os << p.c.name() << " on " << p.ranks << " ranks";
}

class BatchDtypeSweep : public ::testing::TestWithParam<SweepPoint> {};

TEST_P(BatchDtypeSweep, MatchesReferenceWithinBound) {
  check_on_threads(GetParam().c, GetParam().ranks);
}

INSTANTIATE_TEST_SUITE_P(All, BatchDtypeSweep, ::testing::ValuesIn(sweep_points()),
                         [](const ::testing::TestParamInfo<SweepPoint>& info) {
                           return info.param.c.name() + "_n" + std::to_string(info.param.ranks);
                         });

}  // namespace
}  // namespace seqpar

namespace seqpar {
namespace {

using seqpar::testing::Problem;
using seqpar::testing::run_cp;

// CpStats::measured_kv_bytes (storage the call allocated) beside peak_kv_bytes (the blocks read
// at once): equal where blocks are copied; the threads backend's zero-copy ring allocates no
// receive buffer, so it holds only its own shard.
TEST(MeasuredKvBytes, EqualPredictedWhereCopiedOwnShardWhereBorrowed) {
  Problem p;
  p.batch = 2;
  p.seq = 301;
  p.heads = 6;  // every Ulysses member gets query heads
  p.kv_heads = 2;
  p.head_dim = 16;  // 2·Hkv·D·4 = 256 bytes per token: no allocation rounding
  const int ranks = 3;
  Partition part(p.seq, ranks, Layout::kZigzag);
  const int64_t token_kv = 2 * p.batch * p.kv_heads * p.head_dim * 4;
  for (Strategy s : {Strategy::kAllGather, Strategy::kUlysses}) {
    auto run = run_cp(p, s, part);
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(run.cp[r].measured_kv_bytes, run.cp[r].peak_kv_bytes)
          << strategy_name(s) << " rank " << r;
      EXPECT_GT(run.cp[r].measured_kv_bytes, 0);
    }
  }
  auto ring = run_cp(p, Strategy::kRing, part);
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(ring.cp[r].measured_kv_bytes, part.count(r) * token_kv) << "rank " << r;
    EXPECT_GT(ring.cp[r].peak_kv_bytes, ring.cp[r].measured_kv_bytes) << "rank " << r;
  }
}

}  // namespace
}  // namespace seqpar
