// The process mesh: coordinates against a brute-force enumeration of cfg x tp x ring x ulysses,
// heads and token ranges, argument errors, and the sub-communicators' membership (a collective
// over each group reaches exactly the ranks that share the other coordinates).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <random>
#include <set>

#include "parallel/cp_test_util.h"
#include "seqpar/comm/threads.h"
#include "seqpar/parallel/mesh.h"

namespace seqpar {
namespace {

// Every shape with world <= max_world.
std::vector<MeshShape> shapes_up_to(int max_world) {
  std::vector<MeshShape> out;
  for (int c = 1; c <= max_world; ++c)
    for (int t = 1; c * t <= max_world; ++t)
      for (int r = 1; c * t * r <= max_world; ++r)
        for (int u = 1; c * t * r * u <= max_world; ++u) out.push_back({c, t, r, u});
  return out;
}

std::string label(const MeshShape& s) { return mesh_shape_text(s); }

TEST(Mesh, CoordinatesMatchBruteForceEnumeration) {
  for (const MeshShape& s : shapes_up_to(24)) {
    SCOPED_TRACE(label(s));
    Mesh mesh(s);
    ASSERT_EQ(mesh.world_size(), s.cfg * s.tp * s.ring * s.ulysses);
    ASSERT_EQ(mesh.sp_size(), s.ring * s.ulysses);
    // Outermost first: cfg, tp, ring, ulysses; the rank counts up in the innermost loop.
    int rank = 0;
    for (int c = 0; c < s.cfg; ++c)
      for (int t = 0; t < s.tp; ++t)
        for (int r = 0; r < s.ring; ++r)
          for (int u = 0; u < s.ulysses; ++u, ++rank) {
            const MeshCoord want{rank, c, t, r, u, r * s.ulysses + u};
            ASSERT_EQ(mesh.coord(rank), want) << "rank " << rank;
            ASSERT_EQ(mesh.rank_of(c, t, r, u), rank);
          }
    ASSERT_EQ(rank, mesh.world_size());
  }
}

TEST(Mesh, DesignExample) {
  // --tp 4 --ring-degree 8 --heads 40 --seq 1024: rank 8 is tp_rank 1, cp_rank 0, heads 10-19,
  // tokens 0-127.
  Mesh mesh({.tp = 4, .ring = 8});
  mesh.check(40, 1024);
  const MeshCoord c = mesh.coord(8);
  EXPECT_EQ(c.tp_rank, 1);
  EXPECT_EQ(c.cp_rank, 0);
  EXPECT_EQ(c.ring_rank, 0);
  EXPECT_EQ(c.ulysses_rank, 0);
  EXPECT_EQ(c.cfg_rank, 0);
  EXPECT_EQ(mesh.heads(40, c.tp_rank), (IndexRange{10, 20}));
  EXPECT_EQ(mesh.tokens(1024, c.cp_rank), (IndexRange{0, 128}));
  EXPECT_EQ(mesh.coord(31).tp_rank, 3);
  EXPECT_EQ(mesh.tokens(1024, mesh.coord(31).cp_rank), (IndexRange{896, 1024}));
}

TEST(Mesh, HeadsSplitContiguouslyOverTp) {
  for (int tp : {1, 2, 3, 4, 8}) {
    Mesh mesh({.tp = tp});
    for (int64_t heads : {tp * 1, tp * 5, tp * 12}) {
      int64_t next = 0;
      for (int t = 0; t < tp; ++t) {
        const IndexRange h = mesh.heads(heads, t);
        EXPECT_EQ(h.begin, next);
        EXPECT_EQ(h.size(), heads / tp);
        next = h.end;
      }
      EXPECT_EQ(next, heads);
    }
  }
}

TEST(Mesh, TokensMatchTheContiguousPartition) {
  for (const MeshShape& s : shapes_up_to(12)) {
    Mesh mesh(s);
    for (int64_t seq : {int64_t{mesh.sp_size()}, int64_t{mesh.sp_size()} + 1, int64_t{97},
                        int64_t{1024}, int64_t{3645}}) {
      if (seq < mesh.sp_size()) continue;
      const Partition part = mesh.partition(seq);
      for (int cp = 0; cp < mesh.sp_size(); ++cp) {
        const IndexRange t = mesh.tokens(seq, cp);
        const auto pos = part.positions(cp);
        ASSERT_EQ(t.size(), static_cast<int64_t>(pos.size())) << label(s) << " seq " << seq;
        ASSERT_EQ(t.begin, pos.front());
        ASSERT_EQ(t.end, pos.back() + 1);
      }
    }
  }
}

// Runs fn on a message's InvalidArgument and checks it mentions every fragment.
template <typename Fn>
void expect_invalid(Fn fn, std::initializer_list<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "no InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << msg;
  }
}

TEST(Mesh, ArgumentErrorsListValidChoices) {
  expect_invalid([] { Mesh({.tp = 4, .ring = 8}, 16); },
                 {"= 32 ranks", "(ranks) is 16", "ulysses_degree x ring_degree must be 4",
                  "1 x 4, 2 x 2, 4 x 1"});
  expect_invalid([] { Mesh({.tp = 3}, 8); }, {"every degree must divide 8: 1, 2, 4, 8"});
  expect_invalid([] { Mesh({.tp = 0}); }, {"tp 0 is invalid"});
  expect_invalid([] { Mesh({.ulysses = -1}); }, {"ulysses_degree -1 is invalid"});
  expect_invalid([] { Mesh({.tp = 3}).check(40, 64); },
                 {"heads 40 is not divisible by tp 3", "1, 2, 4, 5, 8, 10, 20, 40"});
  expect_invalid([] { Mesh({.tp = 3}).heads(40, 0); }, {"not divisible by tp 3"});
  expect_invalid([] { Mesh({.ring = 4, .ulysses = 2}).check(8, 7); },
                 {"seq 7 is shorter than the sequence-parallel size 8", "seq >= 8"});
  expect_invalid([] { Mesh(MeshShape{}).check(0, 7); }, {"heads 0"});
  expect_invalid([] { Mesh(MeshShape{}).check(4, 0); }, {"seq 0"});
  EXPECT_NO_THROW(Mesh({.cfg = 2, .tp = 2, .ring = 2, .ulysses = 2}, 16).check(2, 4));
}

// ---- sub-communicators ----------------------------------------------------------------------

// On every rank: for each group, all-reduce a one-hot vector of world ranks (1 at this rank) and
// compare the members with those of a brute-force search over the coordinates.
void check_membership(const MeshShape& s) {
  SCOPED_TRACE(label(s));
  const Mesh mesh(s);
  const int n = mesh.world_size();
  std::mutex mu;
  std::set<int> seen;
  ThreadWorld::run(n, [&](Communicator& world) {
    MeshComms mc(world, s);
    const MeshCoord me = mc.coord();
    EXPECT_EQ(me, mesh.coord(world.rank()));
    EXPECT_EQ(&mc.world(), &world);
    EXPECT_EQ(mc.mesh().shape(), s);

    struct Group {
      const char* name;
      Communicator& comm;
      int expected_rank;
      bool (*same)(const MeshCoord&, const MeshCoord&);  // same group as me?
    };
    Group groups[] = {
        {"cfg", mc.cfg(), me.cfg_rank,
         [](const MeshCoord& a, const MeshCoord& b) {
           return a.tp_rank == b.tp_rank && a.cp_rank == b.cp_rank;
         }},
        {"tp", mc.tp(), me.tp_rank,
         [](const MeshCoord& a, const MeshCoord& b) {
           return a.cfg_rank == b.cfg_rank && a.cp_rank == b.cp_rank;
         }},
        {"sp", mc.sp(), me.cp_rank,
         [](const MeshCoord& a, const MeshCoord& b) {
           return a.cfg_rank == b.cfg_rank && a.tp_rank == b.tp_rank;
         }},
        {"ring", mc.ring(), me.ring_rank,
         [](const MeshCoord& a, const MeshCoord& b) {
           return a.cfg_rank == b.cfg_rank && a.tp_rank == b.tp_rank &&
                  a.ulysses_rank == b.ulysses_rank;
         }},
        {"ulysses", mc.ulysses(), me.ulysses_rank,
         [](const MeshCoord& a, const MeshCoord& b) {
           return a.cfg_rank == b.cfg_rank && a.tp_rank == b.tp_rank && a.ring_rank == b.ring_rank;
         }},
    };
    for (Group& g : groups) {
      SCOPED_TRACE(g.name);
      std::vector<int64_t> want(n, 0);
      for (int r = 0; r < n; ++r) want[r] = g.same(me, mesh.coord(r)) ? 1 : 0;
      EXPECT_EQ(g.comm.rank(), g.expected_rank);
      EXPECT_EQ(g.comm.size(), std::count(want.begin(), want.end(), 1));
      std::vector<int64_t> got(n, 0);
      got[world.rank()] = 1;
      g.comm.all_reduce(std::span<int64_t>(got), ReduceOp::kSum);
      EXPECT_EQ(got, want);
      // Group rank order follows the coordinate: gather the world ranks in group order.
      std::vector<int32_t> order(g.comm.size());
      const int32_t mine = world.rank();
      g.comm.all_gather(&mine, sizeof(mine), order.data());
      EXPECT_TRUE(std::is_sorted(order.begin(), order.end()));
    }
    EXPECT_EQ(mc.sp_comms().ulysses_degree(), s.ulysses);
    EXPECT_EQ(mc.sp_comms().ring_degree(), s.ring);
    EXPECT_EQ(&mc.sp_comms().sp(), &mc.sp());
    if (n > 1) {
      EXPECT_GT(mc.stats().total_sent(), 0u);
    }
    mc.reset_stats();
    EXPECT_EQ(mc.stats().total_sent(), 0u);
    std::lock_guard<std::mutex> lock(mu);
    seen.insert(world.rank());
  });
  EXPECT_EQ(static_cast<int>(seen.size()), n);
}

TEST(MeshComms, GroupsHoldExactlyThePeers) {
  for (const MeshShape& s :
       {MeshShape{1, 1, 1, 1}, MeshShape{1, 4, 1, 1}, MeshShape{1, 1, 4, 1}, MeshShape{1, 1, 1, 4},
        MeshShape{2, 1, 1, 1}, MeshShape{1, 2, 2, 2}, MeshShape{2, 2, 2, 1}, MeshShape{2, 1, 2, 2},
        MeshShape{2, 2, 1, 2}, MeshShape{1, 2, 3, 1}, MeshShape{1, 3, 1, 2}, MeshShape{2, 2, 2, 2}})
    check_membership(s);
}

TEST(MeshComms, TpAllReduceSumsExactlyTheTpPeers) {
  // tp 2 x ring 2 x ulysses 2: each rank contributes its world rank; the tp sum is the sum over
  // the ranks with the same cp coordinate (rank = 4·tp_rank + cp_rank).
  const MeshShape s{.cfg = 1, .tp = 2, .ring = 2, .ulysses = 2};
  const Mesh mesh(s);
  ThreadWorld::run(s.world(), [&](Communicator& world) {
    MeshComms mc(world, s);
    const double sum = mc.tp().all_reduce_sum(world.rank());
    double want = 0;
    for (int t = 0; t < s.tp; ++t)
      want += mesh.rank_of(0, t, mc.coord().ring_rank, mc.coord().ulysses_rank);
    EXPECT_EQ(sum, want);
    EXPECT_EQ(sum, 2 * mc.coord().cp_rank + 4);  // cp + (4 + cp)
  });
}

TEST(MeshComms, WrongWorldSizeFailsOnEveryRank) {
  EXPECT_THROW(
      ThreadWorld::run(6, [](Communicator& world) { MeshComms mc(world, MeshShape{.tp = 4}); }),
      InvalidArgument);
}

// Per tp rank: its heads of q/k/v (B, S, H/tp, D), sharded over sp, through usp on the mesh's
// SpComms, equal the reference attention of those heads.
Tensor slice_heads(const Tensor& x, IndexRange h) {
  const int64_t b = x.dim(0), s = x.dim(1), heads = x.dim(2), d = x.dim(3);
  Tensor out({b, s, h.size(), d}, x.dtype());
  const size_t e = dtype_size(x.dtype());
  for (int64_t i = 0; i < b * s; ++i)
    std::memcpy(static_cast<char*>(out.raw()) + (i * h.size()) * d * e,
                static_cast<const char*>(x.raw()) + (i * heads + h.begin) * d * e,
                h.size() * d * e);
  return out;
}

TEST(MeshComms, UspOverTheSpGroupOfEachTpRank) {
  const MeshShape s{.cfg = 1, .tp = 2, .ring = 2, .ulysses = 2};
  testing::Problem p;
  p.seq = 67;  // uneven shards
  p.heads = 8;
  p.kv_heads = 4;
  p.head_dim = 16;
  p.causal = true;
  const testing::Inputs& in = testing::inputs_for(p);
  const Mesh mesh(s);
  mesh.check(p.heads, p.seq);
  const Partition part = mesh.partition(p.seq);
  ThreadWorld::run(s.world(), [&](Communicator& world) {
    MeshComms mc(world, s);
    const MeshCoord c = mc.coord();
    const IndexRange qh = mesh.heads(p.heads, c.tp_rank);
    const IndexRange kvh = mesh.heads(p.kv_heads, c.tp_rank);
    const Tensor q = slice_heads(in.q, qh), k = slice_heads(in.k, kvh), v = slice_heads(in.v, kvh);
    CpOptions opts;
    opts.causal = true;
    AttnState st = testing::cp_call(Strategy::kUsp, mc.sp_comms(), part, shard(q, part, c.cp_rank),
                                    shard(k, part, c.cp_rank), shard(v, part, c.cp_rank), opts);
    const Tensor want = shard(slice_heads(in.ref.out, qh), part, c.cp_rank);
    EXPECT_LT(max_abs_diff(st.out, want), 1e-4) << "rank " << c.rank;
  });
}

// Degrees whose product wraps int (and int64) are refused with the maximum, and a mismatched
// world of 2^16 ranks gets its hint at once (the divisor loop over int used to wrap and trap).
TEST(MeshLimits, HugeDegreesAndWorldsAreRefusedWithoutOverflow) {
  const int big = 1 << 30;
  try {
    Mesh(MeshShape{.cfg = big, .tp = big, .ring = big, .ulysses = big});
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the maximum 65536"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(Mesh(MeshShape{.ring = 2}, 2147483647), InvalidArgument);
  try {
    Mesh(MeshShape{.ring = 2}, 65536);
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("1 x 65536"), std::string::npos) << e.what();
    EXPECT_LT(std::string(e.what()).size(), 600u) << e.what();
  }
  EXPECT_NO_THROW(Mesh(MeshShape{.tp = 256, .ring = 256}));
}

}  // namespace
}  // namespace seqpar
