#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "parallel/cp_test_util.h"

namespace seqpar {

using seqpar::testing::random_tensor;

class PartitionSweep : public ::testing::TestWithParam<std::tuple<Layout, int, int64_t>> {};

TEST_P(PartitionSweep, EveryTokenOnceAscendingBalanced) {
  auto [layout, ranks, seq] = GetParam();
  if (ranks > seq) GTEST_SKIP();
  Partition part(seq, ranks, layout);
  std::vector<int> seen(seq, 0);
  int64_t lo = seq, hi = 0;
  for (int r = 0; r < ranks; ++r) {
    auto pos = part.positions(r);
    EXPECT_FALSE(pos.empty());
    EXPECT_TRUE(std::is_sorted(pos.begin(), pos.end()));
    for (int64_t p : pos) ++seen[p];
    lo = std::min<int64_t>(lo, pos.size());
    hi = std::max<int64_t>(hi, pos.size());
  }
  for (int64_t i = 0; i < seq; ++i) EXPECT_EQ(seen[i], 1) << "token " << i;
  // contiguous and striped: floor or ceil of S/N; zigzag: two chunks of floor/ceil of S/2N.
  EXPECT_LE(hi - lo, layout == Layout::kZigzag ? 2 : 1);
  if (layout == Layout::kContiguous) {
    for (int r = 0; r < ranks; ++r)
      EXPECT_EQ(part.count(r), seq / ranks + (r < seq % ranks ? 1 : 0));
  }
}

INSTANTIATE_TEST_SUITE_P(All, PartitionSweep,
                         ::testing::Combine(::testing::Values(Layout::kContiguous,
                                                              Layout::kStriped, Layout::kZigzag),
                                            ::testing::Values(1, 2, 3, 4, 6, 8),
                                            ::testing::Values(1, 5, 8, 9, 16, 3816, 3817)));

TEST(Partition, ZigzagChunks) {
  Partition part(16, 4, Layout::kZigzag);  // 8 chunks of 2
  EXPECT_EQ(std::vector<int64_t>(part.positions(0).begin(), part.positions(0).end()),
            (std::vector<int64_t>{0, 1, 14, 15}));
  EXPECT_EQ(std::vector<int64_t>(part.positions(3).begin(), part.positions(3).end()),
            (std::vector<int64_t>{6, 7, 8, 9}));
}

TEST(Partition, StripedIsRoundRobin) {
  Partition part(10, 3, Layout::kStriped);
  EXPECT_EQ(std::vector<int64_t>(part.positions(1).begin(), part.positions(1).end()),
            (std::vector<int64_t>{1, 4, 7}));
}

TEST(Partition, RejectsBadSizes) {
  EXPECT_THROW(Partition(0, 1, Layout::kContiguous), InvalidArgument);
  EXPECT_THROW(Partition(8, 0, Layout::kContiguous), InvalidArgument);
  EXPECT_THROW(Partition(4, 5, Layout::kContiguous), InvalidArgument);
  EXPECT_THROW(parse_layout("spiral"), InvalidArgument);
}

TEST(Partition, ShardUnshardRoundTrip) {
  std::mt19937 rng(3);
  Tensor full = random_tensor({2, 37, 3, 5}, rng, DType::kF32);
  for (Layout layout : {Layout::kContiguous, Layout::kStriped, Layout::kZigzag}) {
    Partition part(37, 4, layout);
    std::vector<Tensor> shards;
    for (int r = 0; r < 4; ++r) shards.push_back(shard(full, part, r));
    Tensor back = unshard(shards, part);
    EXPECT_EQ(max_abs_diff(full, back), 0.0);
  }
}

}  // namespace seqpar
