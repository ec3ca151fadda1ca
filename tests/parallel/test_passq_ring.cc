// Ring pass-Q (passq, schedule ring) against reference_attention over ranks 1..8, new tokens
// from 1 (most ranks own no query) to thousands over a small cache, GQA, batch, dtypes, causal
// or not; and its schedule (passq_ring_schedule) against the run: bytes per op kind, work and
// peak K/V of every rank, exactly.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "parallel/cp_check.h"
#include "seqpar/parallel/decode.h"
#include "seqpar/parallel/schedule.h"

namespace seqpar {
namespace {

using seqpar::testing::accumulate_errors;
using seqpar::testing::case_shape;
using seqpar::testing::CaseData;
using seqpar::testing::CheckCase;
using seqpar::testing::expect_within_bound;
using seqpar::testing::make_case_data;
using seqpar::testing::Op;
using seqpar::testing::RankErrors;
using seqpar::testing::rows_at;

struct RingCase {
  int ranks;
  int64_t cached, fresh;
  Layout layout;
  int64_t batch, heads, kv_heads, head_dim;
  DType dtype;
  bool causal;
};

void PrintTo(const RingCase& c, std::ostream* os) {
  *os << "N" << c.ranks << " P" << c.cached << " T" << c.fresh << " " << layout_name(c.layout)
      << " B" << c.batch << " H" << c.heads << "/" << c.kv_heads << " D" << c.head_dim << " "
      << dtype_name(c.dtype) << (c.causal ? " causal" : "");
}

struct Measured {
  std::vector<RankErrors> errors;
  std::vector<CommStats> comm;
  std::vector<CpStats> cp;
};

Measured run_ring(const RingCase& c, const CaseData& data) {
  const KvPlacement place = decode_placement(c.cached, c.fresh, c.ranks, c.layout);
  CpOptions opts;
  opts.causal = c.causal;
  opts.schedule = ScheduleKind::kRing;
  Measured m;
  m.errors.resize(c.ranks);
  m.comm.resize(c.ranks);
  m.cp.resize(c.ranks);
  ThreadWorld::run(c.ranks, [&](Communicator& comm) {
    const int r = comm.rank();
    const Tensor q = rows_at(data.q, place.q_pos[r]);
    const Tensor k = rows_at(data.k, place.kv_pos[r]), v = rows_at(data.v, place.kv_pos[r]);
    const AttnState s = passq_ring_attention(comm, place, q, k, v, opts, &m.cp[r]);
    m.comm[r] = comm.stats();
    accumulate_errors(s, data, place.q_pos[r], c.cached, m.errors[r]);
  });
  return m;
}

CheckCase check_case(const RingCase& c) {
  CheckCase k;
  k.op = Op::kPassQ;
  k.layout = c.layout;
  k.batch = c.batch;
  k.seq = c.cached;
  k.extra = c.fresh;
  k.heads = c.heads;
  k.kv_heads = c.kv_heads;
  k.head_dim = c.head_dim;
  k.dtype = c.dtype;
  k.causal = c.causal;
  k.seed = static_cast<uint32_t>(c.ranks * 1000 + c.fresh);
  return k;
}

ParallelConfig ring_config(const RingCase& c) {
  ParallelConfig config;
  config.strategy = Strategy::kPassQ;
  config.schedule = ScheduleKind::kRing;
  config.mesh.ring = c.ranks;
  config.layout = c.layout;
  return config;
}

uint64_t op_bytes(const std::array<uint64_t, static_cast<size_t>(OpKind::kCount)>& a, OpKind k) {
  return a[static_cast<size_t>(k)];
}

void check_ring(const RingCase& c) {
  const CheckCase kc = check_case(c);
  const CaseData data = make_case_data(kc);
  const Measured m = run_ring(c, data);
  const Schedule s = attention_schedule(ring_config(c), case_shape(kc));
  ASSERT_EQ(s.sp(), c.ranks);
  for (int r = 0; r < c.ranks; ++r) {
    expect_within_bound(kc, data, m.errors[r], c.ranks, r);
    // Bytes per op kind: the ring's send_recv of Q blocks, the all_to_allv of the partials.
    uint64_t ring_sent = 0, ring_recv = 0, a2a_sent = 0, a2a_recv = 0;
    int ring_steps = 0;
    for (const Step& st : s.ranks[r].steps) {
      if (!st.comm) continue;
      if (st.comm->op == OpKind::kSendRecv) {
        EXPECT_TRUE(st.comm->overlaps_compute);
        ring_sent += st.comm->sent;
        ring_recv += st.comm->recv;
        ++ring_steps;
      } else {
        EXPECT_EQ(st.comm->op, OpKind::kAllToAll);
        a2a_sent += st.comm->sent;
        a2a_recv += st.comm->recv;
      }
    }
    EXPECT_EQ(ring_steps, c.ranks - 1);
    const std::string where = "rank " + std::to_string(r);
    EXPECT_EQ(op_bytes(m.comm[r].bytes_sent, OpKind::kSendRecv), ring_sent) << where;
    EXPECT_EQ(op_bytes(m.comm[r].bytes_recv, OpKind::kSendRecv), ring_recv) << where;
    EXPECT_EQ(op_bytes(m.comm[r].bytes_sent, OpKind::kAllToAll), a2a_sent) << where;
    EXPECT_EQ(op_bytes(m.comm[r].bytes_recv, OpKind::kAllToAll), a2a_recv) << where;
    EXPECT_EQ(m.comm[r].total_sent(), schedule_bytes(s, r).sent) << where;
    EXPECT_EQ(m.comm[r].total_recv(), schedule_bytes(s, r).recv) << where;
    EXPECT_EQ(m.cp[r].work, schedule_work(s, r)) << where;
    EXPECT_EQ(m.cp[r].peak_kv_bytes, s.ranks[r].peak_kv_bytes) << where;
  }
}

class PassQRing : public ::testing::TestWithParam<RingCase> {};

TEST_P(PassQRing, MatchesReferenceAndSchedule) { check_ring(GetParam()); }

std::vector<RingCase> ring_cases() {
  std::vector<RingCase> v;
  // Every ring size with T = 1 (one rank owns the query), T < N, T not divisible by N.
  for (int n = 1; n <= 8; ++n)
    for (int64_t fresh : {int64_t{1}, int64_t{3}, int64_t{2 * n + 1}})
      v.push_back({n, 41 + 7 * n, fresh, n % 3 == 0 ? Layout::kZigzag : Layout::kContiguous, 1, 4,
                   2, 16, DType::kF32, true});
  // GQA, batch, dtypes, layouts, causal or not.
  v.push_back({3, 50, 7, Layout::kStriped, 2, 6, 3, 16, DType::kF32, true});
  v.push_back({4, 64, 5, Layout::kZigzag, 3, 8, 1, 16, DType::kF32, false});
  v.push_back({4, 64, 9, Layout::kContiguous, 2, 4, 4, 32, DType::kBF16, true});
  v.push_back({5, 70, 2, Layout::kStriped, 2, 6, 2, 24, DType::kF16, true});
  v.push_back({2, 33, 4, Layout::kContiguous, 1, 4, 2, 32, DType::kBF16, false});
  v.push_back({8, 96, 13, Layout::kZigzag, 2, 8, 2, 16, DType::kF16, true});
  // Thousands of new tokens over a small cache.
  v.push_back({4, 64, 4096, Layout::kContiguous, 1, 2, 1, 16, DType::kF32, true});
  v.push_back({3, 30, 1000, Layout::kZigzag, 2, 4, 2, 16, DType::kBF16, true});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Sweep, PassQRing, ::testing::ValuesIn(ring_cases()));

// The ring moves the same bytes as the all-gather pass-Q in all (a query block reaches every
// other rank once, every partial row returns once), in N-1 overlapped transfers.
TEST(PassQRingSchedule, SameTotalBytesAsAllGatherPassQ) {
  for (int64_t fresh : {1, 5, 64}) {
    ParallelConfig c;
    c.strategy = Strategy::kPassQ;
    c.mesh.ring = 4;
    const AttnShape shape{.batch = 1,
                          .seq = 1000 + fresh,
                          .heads = 8,
                          .kv_heads = 2,
                          .head_dim = 16,
                          .causal = true,
                          .cached = 1000,
                          .fresh = fresh};
    const Schedule gather = attention_schedule(c, shape);
    c.schedule = ScheduleKind::kRing;
    const Schedule ring = attention_schedule(c, shape);
    uint64_t g = 0, q = 0;
    for (int r = 0; r < 4; ++r) {
      g += schedule_bytes(gather, r).sent;
      q += schedule_bytes(ring, r).sent;
      EXPECT_EQ(schedule_work(gather, r), schedule_work(ring, r));
      EXPECT_EQ(gather.ranks[r].peak_kv_bytes, ring.ranks[r].peak_kv_bytes);
    }
    EXPECT_EQ(g, q) << "T " << fresh;
  }
}

TEST(PassQRingSchedule, OnlyWithPassQ) {
  ParallelConfig c;
  c.strategy = Strategy::kPassKv;
  c.schedule = ScheduleKind::kRing;
  c.mesh.ring = 2;
  const AttnShape shape{
      .batch = 1, .seq = 12, .heads = 2, .head_dim = 8, .causal = true, .cached = 10, .fresh = 2};
  EXPECT_THROW(attention_schedule(c, shape), InvalidArgument);
}

}  // namespace
}  // namespace seqpar
