// The strategies over the mpi backend (run under mpiexec with 2 and 4 ranks): results equal the
// reference and measured bytes equal the formulas, as on the threads backend.
#include <gtest/gtest.h>

#include "parallel/cp_test_util.h"
#include "seqpar/comm/mpi.h"

namespace seqpar {

using seqpar::testing::Problem;
using seqpar::testing::inputs_for;
using seqpar::testing::max_err_lse;

class MpiStrategies : public ::testing::TestWithParam<std::tuple<Strategy, Layout, bool, int64_t>> {};

TEST_P(MpiStrategies, MatchReferenceAndFormula) {
  auto [strategy, layout, causal, seq] = GetParam();
  auto comm = mpi_world();
  const int n = comm->size(), r = comm->rank();
  Problem p;
  p.seq = seq;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 64;
  p.causal = causal;
  const auto& in = inputs_for(p);  // every rank builds the same inputs from the seed
  Partition part(seq, n, layout);
  Tensor q = shard(in.q, part, r), k = shard(in.k, part, r), v = shard(in.v, part, r);
  CpOptions opts;
  opts.causal = causal;
  SpComms comms(*comm);
  AttnState s = context_parallel_attention(strategy, comms, part, q, k, v, opts);
  Tensor want_out = shard(in.ref.out, part, r);
  EXPECT_LE(max_abs_diff(s.out, want_out), 1e-4) << "rank " << r;
  Tensor lse4 = in.ref.lse;
  lse4.resize({p.batch, p.seq, p.heads, 1});
  Tensor want_lse = shard(lse4, part, r);
  want_lse.resize({p.batch, part.count(r), p.heads});
  EXPECT_LE(max_err_lse(s.lse, want_lse), 1e-4) << "rank " << r;
  CommPrediction pred =
      predict_comm_bytes(strategy, part, r, p.batch, p.heads, p.kv_heads, p.head_dim, 4);
  EXPECT_EQ(comms.stats().total_sent(), pred.sent) << "rank " << r;
  EXPECT_EQ(comms.stats().total_recv(), pred.recv) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(
    All, MpiStrategies,
    ::testing::Combine(::testing::Values(Strategy::kAllGather, Strategy::kRing, Strategy::kUlysses),
                       ::testing::Values(Layout::kContiguous, Layout::kStriped, Layout::kZigzag),
                       ::testing::Bool(), ::testing::Values(int64_t{64}, int64_t{517})));

}  // namespace seqpar
