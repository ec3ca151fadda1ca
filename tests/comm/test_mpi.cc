// The communicator suite (comm_suite.h) on the mpi backend. Linked with tests/mpi_main.cc into
// test_mpi and run under mpiexec (-n 2 and -n 4, see tests/CMakeLists.txt). Every test uses a
// fresh mpi_world(), so the failure tests (timeouts, aborts, faults) leave later tests a clean
// world. The data tests run three times: with the default limits (small collectives staged),
// Unstaged (every collective on the caller's buffers), and LargeCount (int-count limit lowered
// to 100, so every buffer takes the derived-datatype paths used above 2 GiB).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <thread>

#include "comm/comm_suite.h"
#include "mpi/mpi_internal.h"
#include "seqpar/comm/mpi.h"

namespace seqpar {
namespace {

using std::chrono::milliseconds;
namespace suite = comm_suite;

// Suite runs are bounded: a bug fails in 20 s instead of hanging for the default 60.
constexpr milliseconds kSuiteTimeout{20000};

void on_fresh_world(void (*fn)(Communicator&)) {
  auto world = mpi_world();
  ASSERT_TRUE(world);
  EXPECT_EQ(world->backend(), "mpi");
  world->set_timeout(kSuiteTimeout);
  fn(*world);
}

TEST(MpiSuite, Identity) { on_fresh_world(suite::identity); }
TEST(MpiSuite, RingExchange) { on_fresh_world(suite::ring_exchange); }
TEST(MpiSuite, BorrowRing) { on_fresh_world(suite::borrow_ring); }
TEST(MpiSuite, SameTagOrdering) { on_fresh_world(suite::same_tag_ordering); }
TEST(MpiSuite, TagsDoNotCross) { on_fresh_world(suite::tags_do_not_cross); }
TEST(MpiSuite, P2pSizeMismatch) { on_fresh_world(suite::p2p_size_mismatch); }
TEST(MpiSuite, AllGather) { on_fresh_world(suite::all_gather); }
TEST(MpiSuite, AllGatherV) { on_fresh_world(suite::all_gatherv); }
TEST(MpiSuite, AllToAll) { on_fresh_world(suite::all_to_all); }
TEST(MpiSuite, AllToAllV) { on_fresh_world(suite::all_to_allv); }
TEST(MpiSuite, AllReduce) { on_fresh_world(suite::all_reduce); }
TEST(MpiSuite, Broadcast) { on_fresh_world(suite::broadcast); }
TEST(MpiSuite, Barrier) { on_fresh_world(suite::barrier); }
TEST(MpiSuite, SplitGroups) { on_fresh_world(suite::split_groups); }
TEST(MpiSuite, StatsExact) { on_fresh_world(suite::stats_exact); }
TEST(MpiSuite, TimeoutOnMissingSend) { on_fresh_world(suite::timeout_on_missing_send); }
TEST(MpiSuite, AbortPropagates) { on_fresh_world(suite::abort_propagates); }
TEST(MpiSuite, AbortWakesPendingRecv) { on_fresh_world(suite::abort_wakes_pending_recv); }
TEST(MpiSuite, CheckedMismatches) { on_fresh_world(suite::checked_mismatches); }
TEST(MpiSuite, CheckedFaults) { on_fresh_world(suite::checked_faults); }
TEST(MpiSuite, CheckedDrop) { on_fresh_world(suite::checked_drop); }
// After all the failure tests above, a fresh world still works.
TEST(MpiSuite, UsableAfterFailures) { on_fresh_world(suite::all_reduce); }

class Unstaged : public ::testing::Test {
 protected:
  void SetUp() override {
    old_ = mpi_detail::set_limits_for_testing({mpi_detail::default_limits().max_count, 0});
  }
  void TearDown() override { mpi_detail::set_limits_for_testing(old_); }
  mpi_detail::Limits old_{};
};

class LargeCount : public Unstaged {
 protected:
  void SetUp() override { old_ = mpi_detail::set_limits_for_testing({100, 0}); }
};

#define SEQPAR_DATA_TESTS(Fixture)                                               \
  TEST_F(Fixture, RingExchange) { on_fresh_world(suite::ring_exchange); }        \
  TEST_F(Fixture, SameTagOrdering) { on_fresh_world(suite::same_tag_ordering); } \
  TEST_F(Fixture, AllGather) { on_fresh_world(suite::all_gather); }              \
  TEST_F(Fixture, AllGatherV) { on_fresh_world(suite::all_gatherv); }            \
  TEST_F(Fixture, AllToAll) { on_fresh_world(suite::all_to_all); }               \
  TEST_F(Fixture, AllToAllV) { on_fresh_world(suite::all_to_allv); }             \
  TEST_F(Fixture, AllReduce) { on_fresh_world(suite::all_reduce); }              \
  TEST_F(Fixture, Broadcast) { on_fresh_world(suite::broadcast); }               \
  TEST_F(Fixture, SplitGroups) { on_fresh_world(suite::split_groups); }          \
  TEST_F(Fixture, StatsExact) { on_fresh_world(suite::stats_exact); }            \
  TEST_F(Fixture, P2pSizeMismatch) { on_fresh_world(suite::p2p_size_mismatch); }

SEQPAR_DATA_TESTS(Unstaged)
SEQPAR_DATA_TESTS(LargeCount)

TEST(MpiBackend, Environment) {
  EXPECT_TRUE(mpi_available());
  EXPECT_TRUE(mpi_launched());
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  auto world = mpi_world();
  EXPECT_EQ(world->size(), world_size);
  mpi_init(nullptr, nullptr);  // idempotent
}

// Worlds and their splits are freed when dropped; creating many must not exhaust MPI.
TEST(MpiBackend, ManyWorldsAndSplits) {
  for (int i = 0; i < 30; ++i) {
    auto world = mpi_world();
    auto sub = world->split(world->rank() % 2, 0);
    EXPECT_EQ(sub->all_reduce_sum(1.0), sub->size());
  }
}

TEST(MpiBackend, UseFromAnotherThreadIsAnError) {
  auto world = mpi_world();
  bool threw = false;
  std::thread t([&] {
    try {
      world->barrier();
    } catch (const Error&) {
      threw = true;
    }
  });
  t.join();
  EXPECT_TRUE(threw);
}

// Real > 2 GiB transfers (about 6.5 GB of memory per rank at -n 2): run with SEQPAR_BIG_TESTS=1.
TEST(MpiBackend, HugeAllGatherAndSend) {
  if (std::getenv("SEQPAR_BIG_TESTS") == nullptr) GTEST_SKIP() << "set SEQPAR_BIG_TESTS=1";
  auto world = mpi_world();
  world->set_timeout(milliseconds(600000));
  const int n = world->size(), me = world->rank();
  const size_t bytes = (size_t{1} << 31) + 77;
  std::vector<uint8_t> out(bytes), in(bytes * n);
  for (size_t k = 0; k < bytes; k += 4096) out[k] = suite::pattern(me, 0, k);
  out[bytes - 1] = suite::pattern(me, 0, bytes - 1);
  world->all_gather(out.data(), bytes, in.data());
  for (int i = 0; i < n; ++i) {
    const uint8_t* blk = in.data() + i * bytes;
    for (size_t k = 0; k < bytes; k += 4096) ASSERT_EQ(blk[k], suite::pattern(i, 0, k));
    ASSERT_EQ(blk[bytes - 1], suite::pattern(i, 0, bytes - 1));
  }
  in.clear();
  in.shrink_to_fit();
  std::vector<uint8_t> got(bytes);
  Request r = world->irecv(got.data(), bytes, (me + n - 1) % n, 1);
  Request s = world->isend(out.data(), bytes, (me + 1) % n, 1);
  r.wait();
  s.wait();
  for (size_t k = 0; k < bytes; k += 4096)
    ASSERT_EQ(got[k], suite::pattern((me + n - 1) % n, 0, k));
  EXPECT_EQ(world->stats().bytes_sent[static_cast<size_t>(OpKind::kAllGather)], bytes * (n - 1));
}

}  // namespace
}  // namespace seqpar
