// The cost model against real runs: for every strategy, layout, rank count, uneven length,
// padding, dtype and batch, the predicted bytes of every rank (and of every kind of collective)
// equal the CommStats measured on threads, the predicted work equals CpStats::work and the
// predicted K/V memory equals CpStats::peak_kv_bytes. Plus the alpha-beta times of small
// hand-computed cases.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "plan/plan_test_util.h"
#include "seqpar/plan/cost_model.h"

namespace seqpar {
namespace {

using testing::measure;

HardwareProfile test_profile() {
  HardwareProfile hw;
  hw.name = "test";
  hw.attention_flops = 1e12;
  hw.intra_node_bw = 1e10;
  hw.inter_node_bw = 1e9;
  hw.latency_s = 1e-5;
  hw.inter_node_latency_s = 1e-4;
  hw.ranks_per_node = 8;
  hw.memory_bytes = 1e12;
  hw.overlap = 1;
  return hw;
}

// Which CommStats kind carries a collective of the cost model.
OpKind kind_of(const std::string& op) {
  if (op == "send_recv") return OpKind::kSendRecv;
  if (op == "all_gather" || op == "all_gatherv") return OpKind::kAllGather;
  if (op == "all_to_allv") return OpKind::kAllToAll;
  return OpKind::kAllReduce;
}

// Checks every rank's prediction against the measurement; returns the number of ranks checked.
void expect_matches(const Workload& w, const ParallelConfig& m) {
  SCOPED_TRACE(config_label(m) + " S=" + std::to_string(w.seq) + " B=" + std::to_string(w.batch) +
               " H=" + std::to_string(w.heads) + "/" + std::to_string(w.kv_heads) + " " +
               std::string(dtype_name(w.dtype)) + (w.decode() ? " decode" : "") +
               (w.text_tokens ? " text" : "") +
               (m.softmax == SoftmaxMode::kConstMax ? " const-max" : ""));
  const MeshCost c = cost_mesh(w, m, test_profile());
  const testing::Measured got = measure(w, m, test_profile());
  ASSERT_EQ(c.ranks.size(), got.comm.size());
  for (size_t r = 0; r < c.ranks.size(); ++r) {
    EXPECT_EQ(c.ranks[r].sent, got.comm[r].total_sent()) << "rank " << r;
    EXPECT_EQ(c.ranks[r].recv, got.comm[r].total_recv()) << "rank " << r;
    EXPECT_EQ(c.ranks[r].peak_kv_bytes, got.cp[r].peak_kv_bytes) << "rank " << r;
    EXPECT_EQ(c.ranks[r].work, got.cp[r].work) << "rank " << r;
  }
  // Bytes per kind of collective, on the critical rank (the one whose list is reported).
  const int cr = c.critical_rank;
  std::array<uint64_t, static_cast<size_t>(OpKind::kCount)> sent{}, recv{};
  for (const auto& col : c.collectives) {
    sent[static_cast<size_t>(kind_of(col.op))] += col.sent;
    recv[static_cast<size_t>(kind_of(col.op))] += col.recv;
  }
  for (size_t k = 0; k < sent.size(); ++k) {
    EXPECT_EQ(sent[k], got.comm[cr].bytes_sent[k]) << op_kind_name(static_cast<OpKind>(k));
    EXPECT_EQ(recv[k], got.comm[cr].bytes_recv[k]) << op_kind_name(static_cast<OpKind>(k));
  }
}

struct Degrees {
  Strategy strategy;
  int ulysses, ring;
};

class SequenceBytes
    : public ::testing::TestWithParam<std::tuple<Degrees, Layout, int64_t, bool, DType>> {};

TEST_P(SequenceBytes, EqualMeasured) {
  auto [deg, layout, seq, pad, dtype] = GetParam();
  Workload w = attention_workload(seq, 4, 2, 16, 1, /*causal=*/true, dtype);
  ParallelConfig m;
  m.strategy = deg.strategy;
  m.mesh.ulysses = deg.ulysses;
  m.mesh.ring = deg.ring;
  m.layout = layout;
  m.pad = pad;
  expect_matches(w, m);
}

INSTANTIATE_TEST_SUITE_P(
    AllStrategies, SequenceBytes,
    ::testing::Combine(
        ::testing::Values(Degrees{Strategy::kAllGather, 1, 2}, Degrees{Strategy::kAllGather, 1, 3},
                          Degrees{Strategy::kAllGather, 1, 8}, Degrees{Strategy::kRing, 1, 2},
                          Degrees{Strategy::kRing, 1, 3}, Degrees{Strategy::kRing, 1, 4},
                          Degrees{Strategy::kRing, 1, 8}, Degrees{Strategy::kUlysses, 2, 1},
                          Degrees{Strategy::kUlysses, 3, 1}, Degrees{Strategy::kUlysses, 4, 1},
                          Degrees{Strategy::kUsp, 2, 2}, Degrees{Strategy::kUsp, 2, 3},
                          Degrees{Strategy::kUsp, 3, 2}, Degrees{Strategy::kUsp, 4, 2}),
        ::testing::Values(Layout::kContiguous, Layout::kStriped, Layout::kZigzag),
        ::testing::Values(int64_t{64}, int64_t{67}), ::testing::Bool(),
        ::testing::Values(DType::kF32, DType::kBF16)));

TEST(CostModelBytes, BatchNonCausalAndOddHeads) {
  // Batch 2, non-causal, heads that split unevenly (6 over 4 members, GQA groups crossing
  // members: kv heads expanded for the kernel and carried expanded by usp's ring), 3 heads on 4.
  for (auto [h, kv] : {std::pair<int64_t, int64_t>{6, 2}, {3, 3}, {8, 1}}) {
    for (bool causal : {false, true}) {
      Workload w = attention_workload(45, h, kv, 8, 2, causal, DType::kF32);
      for (Degrees d : {Degrees{Strategy::kUlysses, 4, 1}, Degrees{Strategy::kUsp, 4, 2},
                        Degrees{Strategy::kUsp, 2, 3}, Degrees{Strategy::kRing, 1, 5},
                        Degrees{Strategy::kAllGather, 1, 4}}) {
        ParallelConfig m;
        m.strategy = d.strategy;
        m.mesh.ulysses = d.ulysses;
        m.mesh.ring = d.ring;
        m.layout = Layout::kZigzag;
        expect_matches(w, m);
      }
    }
  }
}

TEST(CostModelBytes, StrictUlyssesWithPadding) {
  Workload w = attention_workload(67, 4, 4, 16, 1, true, DType::kF32);
  for (Degrees d : {Degrees{Strategy::kUlysses, 4, 1}, Degrees{Strategy::kUsp, 2, 2}}) {
    ParallelConfig m;
    m.strategy = d.strategy;
    m.mesh.ulysses = d.ulysses;
    m.mesh.ring = d.ring;
    m.ulysses_mode = UlyssesMode::kStrict;
    m.pad = true;
    expect_matches(w, m);
    m.pad = false;  // 67 does not divide: strict mode cannot run it
    EXPECT_THROW(cost_mesh(w, m, test_profile()), InvalidArgument);
  }
}

TEST(CostModelBytes, JointTextTokens) {
  Workload w = attention_workload(40, 4, 4, 8, 1, false, DType::kF32, /*text_tokens=*/5);
  for (Degrees d : {Degrees{Strategy::kRing, 1, 3}, Degrees{Strategy::kAllGather, 1, 2},
                    Degrees{Strategy::kUlysses, 2, 1}, Degrees{Strategy::kUsp, 2, 2}}) {
    ParallelConfig m;
    m.strategy = d.strategy;
    m.mesh.ulysses = d.ulysses;
    m.mesh.ring = d.ring;
    expect_matches(w, m);
  }
}

TEST(CostModelBytes, DecodePassQAndPassKv) {
  for (auto [p, t] : {std::pair<int64_t, int64_t>{40, 3}, {37, 8}, {50, 1}}) {
    for (int n : {2, 3, 4}) {
      for (Layout layout : {Layout::kContiguous, Layout::kStriped, Layout::kZigzag}) {
        for (Strategy s : {Strategy::kPassQ, Strategy::kPassKv}) {
          Workload w = attention_workload(0, 8, 2, 16, 1, true, DType::kBF16, 0, p, t);
          ParallelConfig m;
          m.strategy = s;
          m.mesh.ring = n;
          m.layout = layout;
          expect_matches(w, m);
        }
      }
    }
  }
}

TEST(CostModelBytes, DecodeRingPassQ) {
  // passq with schedule ring: the Q blocks' ring and the partials' all-to-all, per kind.
  for (auto [p, t] : {std::pair<int64_t, int64_t>{40, 3}, {37, 8}, {50, 1}, {30, 64}}) {
    for (int n : {2, 3, 4}) {
      for (Layout layout : {Layout::kContiguous, Layout::kZigzag}) {
        Workload w = attention_workload(0, 8, 2, 16, 1, true, DType::kBF16, 0, p, t);
        ParallelConfig m;
        m.strategy = Strategy::kPassQ;
        m.schedule = ScheduleKind::kRing;
        m.mesh.ring = n;
        m.layout = layout;
        expect_matches(w, m);
      }
    }
  }
}

TEST(CostModelBytes, ConstMaxKeyNorms) {
  // const-max adds the ring's all-reduce of the key norms (ring: over sp; usp: each ring group).
  for (int64_t seq : {64, 67}) {
    Workload w = attention_workload(seq, 6, 2, 8, 2, true, DType::kF32);
    for (Degrees d : {Degrees{Strategy::kRing, 1, 3}, Degrees{Strategy::kRing, 1, 4},
                      Degrees{Strategy::kUsp, 2, 2}, Degrees{Strategy::kUsp, 4, 2}}) {
      ParallelConfig m;
      m.strategy = d.strategy;
      m.mesh.ulysses = d.ulysses;
      m.mesh.ring = d.ring;
      m.layout = Layout::kZigzag;
      m.softmax = SoftmaxMode::kConstMax;
      expect_matches(w, m);
      const MeshCost c = cost_mesh(w, m, test_profile());
      bool norms = false;
      for (const auto& col : c.collectives) norms |= col.what == "key norms";
      EXPECT_TRUE(norms) << config_label(m);
    }
  }
}

// ---- times: hand-computed alpha-beta cases ---------------------------------------------------

TEST(CostModelTime, RingOverlapsTransferWithCompute) {
  // N = 2, S = 2048 non-causal, H = 8, D = 128, fp32: each step attends 1024 x 1024 x 8
  // scores = 4·128·8·2^20 flops = 4.295 ms at 1 TFLOP/s; a K/V block is 1024·2·8·128·4 bytes =
  // 8.39 MB = 0.839 ms + 10 us at 10 GB/s. The profile copies blocks, so seqpar run's call lends
  // its K/V (kLend): two transfers, the peer's block behind the first step's compute and the own
  // block home behind the second's.
  Workload w = attention_workload(2048, 8, 8, 128, 1, false, DType::kF32);
  ParallelConfig m;
  m.strategy = Strategy::kRing;
  m.mesh.ring = 2;
  HardwareProfile hw = test_profile();
  const double step = 4.0 * 128 * 8 * 1024.0 * 1024 / 1e12;
  const double xfer = 1e-5 + 1024.0 * 2 * 8 * 128 * 4 / 1e10;
  MeshCost c = cost_mesh(w, m, hw);
  EXPECT_NEAR(c.layer_s, 2 * step, 1e-12);
  EXPECT_NEAR(c.compute_s, 2 * step, 1e-12);
  EXPECT_NEAR(c.comm_s, 2 * xfer, 1e-12);
  EXPECT_NEAR(c.exposed_comm_s, 0, 1e-12);
  hw.overlap = 0;  // no overlap: the copies are paid on the rank's own time
  c = cost_mesh(w, m, hw);
  EXPECT_NEAR(c.layer_s, 2 * step + 2 * xfer, 1e-12);
  hw.overlap = 1;
  hw.intra_node_bw = 1e9;  // slow link: each transfer (8.39 ms) outlasts its step's compute
  c = cost_mesh(w, m, hw);
  const double slow = 1e-5 + 1024.0 * 2 * 8 * 128 * 4 / 1e9;
  EXPECT_NEAR(c.layer_s, 2 * slow, 1e-12);
  // A shared node's threads read the peer's block in place (kKeep): one transfer.
  hw = test_profile();
  hw.shared_node = true;
  hw.cores_per_node = 2;
  c = cost_mesh(w, m, hw);
  EXPECT_NEAR(c.comm_s, xfer, 1e-12);
}

TEST(CostModelTime, AllGatherThenCompute) {
  // Two all_gatherv (K, V) of 1024·8·128·4 bytes received each, then 1024 x 2048 x 8 scores.
  Workload w = attention_workload(2048, 8, 8, 128, 1, false, DType::kF32);
  ParallelConfig m;
  m.strategy = Strategy::kAllGather;
  m.mesh.ring = 2;
  const MeshCost c = cost_mesh(w, m, test_profile());
  const double gather = 2 * (1e-5 + 1024.0 * 8 * 128 * 4 / 1e10);
  const double compute = 4.0 * 128 * 8 * 1024.0 * 2048 / 1e12;
  EXPECT_NEAR(c.layer_s, gather + compute, 1e-12);
  EXPECT_NEAR(c.exposed_comm_s, gather, 1e-12);
  ASSERT_EQ(c.collectives.size(), 2u);
  EXPECT_EQ(c.collectives[0].op, "all_gatherv");
  EXPECT_EQ(c.collectives[0].what, "k");
}

TEST(CostModelTime, TwoLevelNetwork) {
  // 16 ranks of a ring with 8 ranks per node: the hops 7 -> 8 and 15 -> 0 cross nodes, so the
  // ring is paced by the between-node link; with 16 per node it is not. 16 transfers: seqpar
  // run's call lends its K/V where blocks are copied (the 16th brings the own block home).
  Workload w = attention_workload(16384, 8, 8, 128, 1, false, DType::kBF16);
  ParallelConfig m;
  m.strategy = Strategy::kRing;
  m.mesh.ring = 16;
  HardwareProfile hw = test_profile();
  hw.attention_flops = 1e15;  // transfers dominate
  MeshCost two = cost_mesh(w, m, hw);
  EXPECT_TRUE(two.collectives.at(0).inter_node);
  hw.ranks_per_node = 16;
  MeshCost one = cost_mesh(w, m, hw);
  EXPECT_FALSE(one.collectives.at(0).inter_node);
  const double block = 1024.0 * 2 * 8 * 128 * 2;
  EXPECT_NEAR(one.layer_s, 16 * (1e-5 + block / 1e10) + one.compute_s / 16, one.layer_s * 0.02);
  EXPECT_GT(two.layer_s, 5 * one.layer_s);
}

TEST(CostModelTime, UlyssesIsExposedAllToAll) {
  Workload w = attention_workload(4096, 8, 8, 128, 1, false, DType::kF32);
  ParallelConfig m;
  m.strategy = Strategy::kUlysses;
  m.mesh.ulysses = 4;
  const MeshCost c = cost_mesh(w, m, test_profile());
  double comm = 0;
  for (const auto& col : c.collectives) comm += col.seconds;
  EXPECT_NEAR(c.comm_s, comm, 1e-15);
  EXPECT_NEAR(c.layer_s, c.compute_s + c.comm_s, 1e-12);  // nothing overlaps
  // q, k, v in one all_to_allv and out+lse in another: each member receives its heads' three
  // tensors from 3 peers (3 latencies a call): 3 · 1024 · 2 heads · 128 · 4 bytes per tensor.
  const double qkv = 3 * 1e-5 + 3 * 3.0 * 1024 * 2 * 128 * 4 / 1e10;
  const double back = 3 * 1e-5 + 3.0 * 1024 * 2 * 129 * 4 / 1e10;
  const double counts = 3 * 1e-5 + 24 / 1e10;
  EXPECT_NEAR(c.comm_s, qkv + back + counts, 1e-12);
}

TEST(CostModel, MemoryAndShapesOfAModel) {
  // Wan 2.1 14B at 3645 tokens on 8 H100: weights 28 GB per rank at tp 1, 7 GB at tp 4.
  const ModelPreset& wan = model_preset("wan2.1-t2v-14b");
  Workload w = model_workload(wan, 3645, 1, DType::kBF16, true, 0);
  const HardwareProfile hw = hardware_profile("h100");
  ParallelConfig m;
  m.strategy = Strategy::kRing;
  m.mesh.ring = 8;
  MeshCost c = cost_mesh(w, m, hw);
  EXPECT_DOUBLE_EQ(c.weight_bytes, 28e9);
  EXPECT_TRUE(c.fits_memory);
  EXPECT_EQ(c.remainder, 3645 % 8);
  EXPECT_EQ(c.tp_bytes, 0u);
  m.mesh.tp = 4;
  m.mesh.ring = 2;
  c = cost_mesh(w, m, hw);
  EXPECT_DOUBLE_EQ(c.weight_bytes, 7e9);
  // tp all-reduce as CommStats counts it: n·(tp-1) for each of 3 reduces of B·n_r·hidden·e,
  // batch 2 (both guidance branches on every rank at cfg 1).
  EXPECT_EQ(c.tp_bytes, 3ull * 2 * 1823 * 5120 * 2 * 3);
  m.mesh.cfg = 3;
  EXPECT_THROW(cost_mesh(w, m, hw), InvalidArgument);
  m.mesh.cfg = 1;
  m.mesh.tp = 3;  // 40 heads do not split 3 ways
  EXPECT_THROW(cost_mesh(w, m, hw), InvalidArgument);
}

}  // namespace
}  // namespace seqpar
