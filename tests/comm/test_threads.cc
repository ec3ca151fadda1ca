// The communicator suite (comm_suite.h) on the threads backend for 1, 2, 3, 4 and 8 ranks, plus
// what only an in-process world can check: ThreadWorld::run's error handling, barrier
// semantics through shared memory, withdrawing unwaited requests, a waiting rank running
// another's chunks, CommStats and the timeout setting.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/comm_suite.h"
#include "seqpar/comm/threads.h"
#include "seqpar/core/team.h"

namespace seqpar {
namespace {

using std::chrono::milliseconds;
namespace suite = comm_suite;

// Suite runs are bounded: a bug fails in 20 s instead of hanging for the default 60.
constexpr milliseconds kSuiteTimeout{20000};

// Sets an environment variable (or unsets it, for nullptr) for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  bool had_ = false;
  std::string old_;
};

// (ranks, SEQPAR_SPIN_US): every waiter sleeps at once ("0"), or spins first ("50", even with
// more ranks than CPUs), or the default (nullptr: spins while ranks <= CPUs).
using SuiteParam = std::tuple<int, const char*>;

class ThreadsSuite : public ::testing::TestWithParam<SuiteParam> {
 protected:
  void run(void (*fn)(Communicator&)) {
    ScopedEnv spin("SEQPAR_SPIN_US", std::get<1>(GetParam()));
    ThreadWorld::run(
        std::get<0>(GetParam()),
        [fn](Communicator& c) {
          EXPECT_EQ(c.backend(), "threads");
          fn(c);
        },
        kSuiteTimeout);
  }
};

TEST_P(ThreadsSuite, Identity) { run(suite::identity); }
TEST_P(ThreadsSuite, RingExchange) { run(suite::ring_exchange); }
TEST_P(ThreadsSuite, BorrowRing) { run(suite::borrow_ring); }
TEST_P(ThreadsSuite, SameTagOrdering) { run(suite::same_tag_ordering); }
TEST_P(ThreadsSuite, TagsDoNotCross) { run(suite::tags_do_not_cross); }
TEST_P(ThreadsSuite, P2pSizeMismatch) { run(suite::p2p_size_mismatch); }
TEST_P(ThreadsSuite, AllGather) { run(suite::all_gather); }
TEST_P(ThreadsSuite, AllGatherV) { run(suite::all_gatherv); }
TEST_P(ThreadsSuite, AllToAll) { run(suite::all_to_all); }
TEST_P(ThreadsSuite, AllToAllV) { run(suite::all_to_allv); }
TEST_P(ThreadsSuite, AllReduce) { run(suite::all_reduce); }
TEST_P(ThreadsSuite, Broadcast) { run(suite::broadcast); }
TEST_P(ThreadsSuite, Barrier) { run(suite::barrier); }
TEST_P(ThreadsSuite, SplitGroups) { run(suite::split_groups); }
TEST_P(ThreadsSuite, StatsExact) { run(suite::stats_exact); }
TEST_P(ThreadsSuite, TimeoutOnMissingSend) { run(suite::timeout_on_missing_send); }
TEST_P(ThreadsSuite, AbortPropagates) { run(suite::abort_propagates); }
TEST_P(ThreadsSuite, AbortWakesPendingRecv) { run(suite::abort_wakes_pending_recv); }
TEST_P(ThreadsSuite, CheckedMismatches) { run(suite::checked_mismatches); }
TEST_P(ThreadsSuite, CheckedDrop) { run(suite::checked_drop); }

TEST_P(ThreadsSuite, CheckedFaults) { run(suite::checked_faults); }

INSTANTIATE_TEST_SUITE_P(Sizes, ThreadsSuite,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 8),
                                            ::testing::Values(nullptr, "0", "50")),
                         [](const auto& info) {
                           const char* spin = std::get<1>(info.param);
                           return std::string("n") + std::to_string(std::get<0>(info.param)) +
                                  (spin == nullptr ? "" : std::string("_spin") + spin);
                         });

// ---------------------------------------------------------------------------------------------
// ThreadWorld::run

// Rank 2 throws while the others block in a barrier (with a 60 s timeout): they fail fast with
// "rank 2 failed: ...", and run() rethrows rank 2's own exception with its type.
TEST(ThreadWorldRun, ExceptionOnOneRankFailsAllAndKeepsItsType) {
  std::mutex mu;
  std::vector<std::string> seen;
  try {
    ThreadWorld::run(
        4,
        [&](Communicator& c) {
          if (c.rank() == 2) throw InvalidArgument("rank two's bad argument");
          try {
            c.barrier();
          } catch (const CommError& e) {
            std::lock_guard<std::mutex> lk(mu);
            seen.push_back(e.what());
            throw;
          }
        },
        milliseconds(60000));
    FAIL() << "run() returned normally";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "rank two's bad argument");
  }
  ASSERT_EQ(seen.size(), 3u);
  // Not a timeout: the abort reached them, they did not wait out the 60 s.
  for (const auto& m : seen) EXPECT_EQ(m, "rank 2 failed: rank two's bad argument");
}

TEST(ThreadWorldRun, NonSeqparExceptionKeepsItsType) {
  EXPECT_THROW(ThreadWorld::run(3,
                                [](Communicator& c) {
                                  if (c.rank() == 0) throw std::out_of_range("index 9");
                                  std::vector<uint8_t> buf(4);
                                  c.irecv(buf.data(), 4, 0, 1).wait();  // rank 0 never sends
                                }),
               std::out_of_range);
}

// A rank that times out aborts inside its wait, before its exception reaches run(): run() still
// rethrows the timeout, not a peer's "rank 0 failed" report of it.
TEST(ThreadWorldRun, RethrowsTheTimeoutNotItsEchoes) {
  try {
    ThreadWorld::run(
        4,
        [](Communicator& c) {
          if (c.rank() == 0) {
            c.set_timeout(milliseconds(100));
            int v;
            c.irecv(&v, sizeof v, 1, 7).wait();
          } else {
            c.barrier();
          }
        },
        milliseconds(60000));
    FAIL() << "run() returned normally";
  } catch (const CommError& e) {
    EXPECT_EQ(std::string(e.what()),
              "timeout after 0.1 s: rank 0 waiting for recv from rank 1 (tag 7); set "
              "SEQPAR_TIMEOUT_S to wait longer");
  }
}

TEST(ThreadWorldRun, NoErrorNoThrow) {
  std::atomic<int> ran{0};
  ThreadWorld::run(5, [&](Communicator& c) {
    EXPECT_EQ(c.size(), 5);
    ++ran;
  });
  EXPECT_EQ(ran.load(), 5);
}

TEST(ThreadWorldRun, ExplicitAbortWithoutThrowStillFailsRun) {
  EXPECT_THROW(ThreadWorld::run(2,
                                [](Communicator& c) {
                                  if (c.rank() == 1) {
                                    c.abort("quietly giving up");
                                    return;
                                  }
                                  c.barrier();
                                }),
               CommError);
}

TEST(ThreadWorldRun, TimeoutOfCollectiveNamesLateRanks) {
  try {
    ThreadWorld::run(4, [](Communicator& c) {
      if (c.rank() == 3) return;  // never joins
      c.set_timeout(milliseconds(100));
      if (c.rank() == 0) {
        c.all_gather(nullptr, 0, nullptr);
      } else {
        c.set_timeout(milliseconds(30000));
        c.all_gather(nullptr, 0, nullptr);
      }
    });
    FAIL() << "run() returned normally";
  } catch (const CommError& e) {
    EXPECT_EQ(std::string(e.what()),
              "timeout after 0.1 s: rank 0 waiting for all_gather (rank(s) 3 of 4 not arrived); "
              "set SEQPAR_TIMEOUT_S to wait longer");
  }
}

TEST(ThreadWorldRun, SubCommunicatorTimeoutNamesWorldRank) {
  try {
    ThreadWorld::run(
        4,
        [](Communicator& c) {
          auto sub = c.split(c.rank() % 2, 0);
          if (c.rank() == 3) {
            sub->set_timeout(milliseconds(100));
            int v;
            sub->irecv(&v, sizeof v, 0, 2).wait();  // sub rank 0 = world rank 1, never sends
          } else {
            c.barrier();
          }
        },
        milliseconds(30000));
    FAIL() << "run() returned normally";
  } catch (const CommError& e) {
    suite::expect_contains(e.what(), "rank 1 (world rank 3) waiting for recv from rank 0 (tag 2)");
  }
}

// ---------------------------------------------------------------------------------------------
// Threads-only semantics

TEST(ThreadsBackend, BarrierOrdersMemory) {
  std::atomic<int> arrived{0};
  ThreadWorld::run(6, [&](Communicator& c) {
    for (int round = 1; round <= 50; ++round) {
      ++arrived;
      c.barrier();
      EXPECT_EQ(arrived.load(), 6 * round);
      c.barrier();
    }
  });
}

// Receivers copy straight from the sender's buffer: a send completes only once received.
TEST(ThreadsBackend, SendIsRendezvous) {
  ThreadWorld::run(2, [](Communicator& c) {
    int v = 42, got = 0;
    if (c.rank() == 0) {
      Request s = c.isend(&v, sizeof v, 1, 0);
      EXPECT_FALSE(s.test());
      c.barrier();  // rank 1 receives after this
      c.barrier();
      EXPECT_TRUE(s.test());
    } else {
      c.barrier();
      c.irecv(&got, sizeof got, 0, 0).wait();
      EXPECT_EQ(got, 42);
      c.barrier();
    }
  });
}

// A request dropped without wait is withdrawn: no peer copies into or out of its buffer later.
TEST(ThreadsBackend, DroppedRequestIsWithdrawn) {
  ThreadWorld::run(2, [](Communicator& c) {
    if (c.rank() == 0) {
      {
        auto first = std::make_unique<int>(1);
        Request dropped = c.isend(first.get(), sizeof(int), 1, 4);
      }  // request and buffer gone
      c.barrier();
      int second = 2;
      c.isend(&second, sizeof second, 1, 4).wait();
    } else {
      {
        int never = 0;
        Request dropped = c.irecv(&never, sizeof never, 0, 5);
      }
      c.barrier();
      int got = 0;
      c.irecv(&got, sizeof got, 0, 4).wait();
      EXPECT_EQ(got, 2);
    }
  });
}

TEST(ThreadsBackend, WaitAllWaitsEveryRequestAndRethrowsTheFirstFailure) {
  ThreadWorld::run(2, [](Communicator& c) {
    if (c.rank() == 0) {
      int a = 1, b = 2;
      c.isend(&a, sizeof a, 1, 1).wait();
      EXPECT_THROW(c.isend(&a, sizeof a, 1, 3).wait(), CommError);  // receiver expects 2 bytes
      c.isend(&b, sizeof b, 1, 1).wait();
    } else {
      int a = 0, b = 0;
      std::vector<Request> reqs;
      reqs.push_back(c.irecv(&a, sizeof a, 0, 1));
      reqs.push_back(c.irecv(&a, 2, 0, 3));  // size mismatch
      reqs.push_back(c.irecv(&b, sizeof b, 0, 1));
      EXPECT_THROW(wait_all(reqs), CommError);
      EXPECT_EQ(a, 1);
      EXPECT_EQ(b, 2);                // waited although an earlier request failed
      EXPECT_FALSE(reqs[0].valid());  // completed requests are released
      EXPECT_TRUE(reqs[1].valid());
    }
  });
}

TEST(ThreadsBackend, ArgumentErrors) {
  ThreadWorld::run(2, [](Communicator& c) {
    int v = 0;
    EXPECT_THROW(c.isend(&v, 4, 2, 0), InvalidArgument);
    EXPECT_THROW(c.irecv(&v, 4, -1, 0), InvalidArgument);
    EXPECT_THROW(c.isend(&v, 4, 0, -3), InvalidArgument);
    EXPECT_THROW(c.isend(nullptr, 4, 0, 0), InvalidArgument);
    std::vector<size_t> counts(3, 1);
    EXPECT_THROW(c.all_gatherv(&v, &v, counts), InvalidArgument);
    EXPECT_THROW(c.broadcast(&v, 4, 5), InvalidArgument);
    EXPECT_THROW(c.all_to_all(&v, &v, 2), InvalidArgument);
    c.barrier();  // argument errors are local and leave the world usable
  });
  EXPECT_THROW(ThreadWorld(0), InvalidArgument);
  ThreadWorld world(2);
  EXPECT_EQ(world.size(), 2);
  auto c0 = world.communicator(0);
  EXPECT_THROW(world.communicator(0), Error);
  EXPECT_THROW(world.communicator(2), InvalidArgument);
}

TEST(ThreadsBackend, CollectiveMismatchFailsEveryRankAlike) {
  ThreadWorld::run(3, [](Communicator& c) {
    std::vector<uint8_t> buf(64 * 3);
    std::string msg = suite::comm_error_of(
        [&] { c.all_gather(buf.data(), c.rank() == 2 ? 32 : 64, buf.data() + 64); }, "mismatch");
    EXPECT_EQ(msg, "all_gather size mismatch: rank 0 sends 64 bytes, rank 2 sends 32");
    msg = suite::comm_error_of(
        [&] {
          if (c.rank() == 1) {
            c.barrier();
          } else {
            double x = 0;
            c.all_reduce(&x, 1, Communicator::Elem::kF64, ReduceOp::kSum);
          }
        },
        "kind mismatch");
    EXPECT_EQ(msg, "collective mismatch: rank 0 calls all_reduce, rank 1 calls barrier");
    EXPECT_EQ(c.all_reduce_sum(1.0), 3.0);  // the group is still usable
  });
}

TEST(ThreadsBackend, ManyConcurrentGroups) {
  // 8 ranks, pairs and quads, each running rings and reductions at the same time, repeatedly.
  ThreadWorld::run(8, [](Communicator& c) {
    auto pair = c.split(c.rank() / 2, 0);
    auto quad = c.split(c.rank() / 4, c.rank());
    for (int it = 0; it < 200; ++it) {
      for (Communicator* g : {pair.get(), quad.get(), &c}) {
        const int n = g->size(), me = g->rank();
        int out = it * 100 + me, in = -1;
        Request r = g->irecv(&in, sizeof in, (me + n - 1) % n, it % 3);
        Request s = g->isend(&out, sizeof out, (me + 1) % n, it % 3);
        r.wait();
        s.wait();
        ASSERT_EQ(in, it * 100 + (me + n - 1) % n);
      }
      ASSERT_EQ(quad->all_reduce_sum(1.0), 4.0);
      ASSERT_EQ(pair->all_reduce_max(c.rank()), (c.rank() / 2) * 2 + 1);
    }
  });
}

// Rank 2 fails while ranks 0 and 1 are inside a large all_reduce of their own group. A member
// must not leave the reduction's phases on the abort: its peer may still be reading its buffer,
// which unwinding would free (a 64 MiB buffer is unmapped, so the peer would fault). Each member
// finishes the reduction with the right sum and meets the abort at its next call.
TEST(ThreadWorldRun, AbortDuringAReductionLetsItFinish) {
  constexpr size_t kFloats = size_t{16} << 20;
  for (int trial = 0; trial < 4; ++trial) {
    std::atomic<int> entered{0};
    EXPECT_THROW(ThreadWorld::run(3,
                                  [&](Communicator& c) {
                                    auto pair = c.split(c.rank() < 2 ? 0 : 1, c.rank());
                                    if (c.rank() == 2) {
                                      while (entered.load() < 2) std::this_thread::yield();
                                      std::this_thread::sleep_for(milliseconds(2 * trial));
                                      throw std::runtime_error("rank two fails");
                                    }
                                    std::vector<float> buf(kFloats, 1.0f + c.rank());
                                    ++entered;
                                    // Throws only if the abort came before it began.
                                    pair->all_reduce(std::span<float>(buf), ReduceOp::kSum);
                                    for (size_t i = 0; i < kFloats; i += 4099)
                                      ASSERT_EQ(buf[i], 3.0f) << "index " << i;
                                    c.barrier();
                                  }),
                 std::runtime_error);
  }
}

// A rank waiting for another (here in a barrier) runs chunks of the other's open loop (the
// ranks' TeamBoard, core/team.h). Each rank runs one thread (no team workers), and rank 0's two
// chunks meet each other, so its loop ends only if rank 1 runs one while it waits. Rank 1 enters
// its barrier once rank 0's loop is open (its first chunk has arrived), so its wait finds the
// other chunk unclaimed however the two threads were scheduled before. Were it not helped, rank
// 1's barrier would time out and release rank 0's chunk, and the test fail.
TEST(ThreadWorldRun, AWaitingRankRunsAnotherRanksChunks) {
  ScopedEnv spin("SEQPAR_SPIN_US", "100");
  std::atomic<int> arrived{0};
  std::vector<std::thread::id> rank_thread(2), ran_on(2);
  ThreadWorld::run(
      2,
      [&](Communicator& c) {
        omp_set_num_threads(1);
        rank_thread[c.rank()] = std::this_thread::get_id();
        if (c.rank() == 0) {
          parallel_for(2, [&](int64_t i) {
            arrived.fetch_add(1);
            arrived.notify_all();
            for (int seen = arrived.load(); seen < 2; seen = arrived.load()) arrived.wait(seen);
            arrived.notify_all();
            ran_on[i] = std::this_thread::get_id();
          });
        }
        if (c.rank() == 1)
          for (int seen = arrived.load(); seen < 1; seen = arrived.load()) arrived.wait(seen);
        try {
          c.barrier();
        } catch (...) {
          arrived.fetch_add(2);  // releases rank 0's chunk
          arrived.notify_all();
          throw;
        }
      },
      kSuiteTimeout);
  EXPECT_NE(ran_on[0], ran_on[1]);
  for (int i = 0; i < 2; ++i)
    EXPECT_TRUE(ran_on[i] == rank_thread[0] || ran_on[i] == rank_thread[1]) << "chunk " << i;
}

// ---------------------------------------------------------------------------------------------
// Shared pieces: CommStats, Request, the timeout setting

TEST(CommStats, AddAccumulateReset) {
  CommStats a, b;
  a.add(OpKind::kAllGather, 10, 20);
  a.add(OpKind::kAllGather, 1, 2);
  b.add(OpKind::kBarrier, 0, 0);
  b.add(OpKind::kSendRecv, 5, 0);
  b.wait_seconds = 0.5;
  a += b;
  EXPECT_EQ(a.bytes_sent[static_cast<size_t>(OpKind::kAllGather)], 11u);
  EXPECT_EQ(a.bytes_recv[static_cast<size_t>(OpKind::kAllGather)], 22u);
  EXPECT_EQ(a.ops[static_cast<size_t>(OpKind::kAllGather)], 2u);
  EXPECT_EQ(a.ops[static_cast<size_t>(OpKind::kBarrier)], 1u);
  EXPECT_EQ(a.total_sent(), 16u);
  EXPECT_EQ(a.total_recv(), 22u);
  EXPECT_EQ(a.wait_seconds, 0.5);
  a.reset();
  EXPECT_EQ(a.total_sent(), 0u);
  EXPECT_EQ(a.ops[static_cast<size_t>(OpKind::kAllGather)], 0u);
}

TEST(CommStats, OpKindNames) {
  EXPECT_EQ(op_kind_name(OpKind::kSendRecv), "send_recv");
  EXPECT_EQ(op_kind_name(OpKind::kAllGather), "all_gather");
  EXPECT_EQ(op_kind_name(OpKind::kAllToAll), "all_to_all");
  EXPECT_EQ(op_kind_name(OpKind::kAllReduce), "all_reduce");
  EXPECT_EQ(op_kind_name(OpKind::kBroadcast), "broadcast");
  EXPECT_EQ(op_kind_name(OpKind::kBarrier), "barrier");
}

TEST(RequestTest, DefaultIsComplete) {
  Request r;
  EXPECT_FALSE(r.valid());
  EXPECT_TRUE(r.test());
  r.wait();
  std::vector<Request> none(3);
  wait_all(none);
}

TEST(DefaultTimeout, FromEnvironment) {
  {
    ScopedEnv env("SEQPAR_TIMEOUT_S", nullptr);
    EXPECT_EQ(Communicator::default_timeout(), milliseconds(60000));
  }
  {
    ScopedEnv env("SEQPAR_TIMEOUT_S", "0.25");
    EXPECT_EQ(Communicator::default_timeout(), milliseconds(250));
    ThreadWorld::run(2, [](Communicator& c) { EXPECT_EQ(c.timeout(), milliseconds(250)); });
  }
  {
    ScopedEnv env("SEQPAR_TIMEOUT_S", "120");
    EXPECT_EQ(Communicator::default_timeout(), milliseconds(120000));
  }
  for (const char* bad : {"abc", "-1", "0", "5s", "nan", "inf", "1e30"}) {
    ScopedEnv env("SEQPAR_TIMEOUT_S", bad);
    try {
      Communicator::default_timeout();
      ADD_FAILURE() << "accepted SEQPAR_TIMEOUT_S=" << bad;
    } catch (const InvalidArgument& e) {
      suite::expect_contains(e.what(), "SEQPAR_TIMEOUT_S");
    }
  }
}

// SEQPAR_SPIN_US: whole microseconds from 0 to 1e6; anything else fails the world's creation
// in one line naming the variable.
TEST(SpinSetting, FromEnvironment) {
  for (const char* good : {"0", "1", "1000000"}) {
    ScopedEnv env("SEQPAR_SPIN_US", good);
    ThreadWorld::run(2, [](Communicator& c) { c.barrier(); });
  }
  for (const char* bad : {"abc", "-1", "1000001", "5us", "1.5", " 3"}) {
    ScopedEnv env("SEQPAR_SPIN_US", bad);
    try {
      ThreadWorld world(2);
      ADD_FAILURE() << "accepted SEQPAR_SPIN_US=" << bad;
    } catch (const InvalidArgument& e) {
      suite::expect_contains(e.what(), "SEQPAR_SPIN_US='");
      suite::expect_contains(e.what(),
                             "expected whole microseconds from 0 (never spin) to 1000000");
    }
  }
}

TEST(DefaultTimeout, SplitInheritsTimeout) {
  ThreadWorld::run(2, [](Communicator& c) {
    c.set_timeout(milliseconds(1234));
    auto sub = c.split(0, 0);
    EXPECT_EQ(sub->timeout(), milliseconds(1234));
  });
}

// ---------------------------------------------------------------------------------------------
// Zero copy: irecv_borrow

// The receiver gets the sender's own buffer (no copy), and the send completes only when the
// receiver drops its lease; both posting orders.
TEST(ThreadsBorrow, ReadsTheSendBufferInPlaceUntilTheLeaseIsDropped) {
  for (bool recv_first : {false, true}) {
    std::atomic<const void*> sent_at{nullptr};
    ThreadWorld::run(2, [&](Communicator& c) {
      EXPECT_TRUE(c.borrows());
      if (c.rank() == 0) {
        std::vector<uint8_t> buf = suite::make_block(0, 1, 5000);
        sent_at = buf.data();
        c.barrier();  // A: rank 1 posts its receive before (recv_first) or after
        Request s = c.isend(buf.data(), buf.size(), 1, 9);
        c.barrier();  // B: rank 1 has the data
        EXPECT_FALSE(s.test()) << "lent: the receiver still reads the buffer";
        c.barrier();  // C: then rank 1 drops the lease
        s.wait();
        EXPECT_TRUE(s.test());
      } else {
        const void* data = nullptr;
        std::shared_ptr<void> lease;
        Request r;
        if (recv_first) r = c.irecv_borrow(nullptr, 5000, 0, 9, &data, &lease);
        c.barrier();  // A
        if (!recv_first) r = c.irecv_borrow(nullptr, 5000, 0, 9, &data, &lease);
        r.wait();
        EXPECT_EQ(data, sent_at.load());
        suite::expect_block(static_cast<const uint8_t*>(data), 0, 1, 5000, 0, "borrowed");
        EXPECT_EQ(c.stats().bytes_recv[static_cast<size_t>(OpKind::kSendRecv)], 5000u);
        c.barrier();  // B
        c.barrier();  // C: rank 0 has seen its send still lent
        lease.reset();
      }
    });
  }
}

// A lease dropped before the send arrives: the send completes at once (nothing is lent).
TEST(ThreadsBorrow, LeaseDroppedBeforeTheMatchLendsNothing) {
  ThreadWorld::run(2, [](Communicator& c) {
    int v = 7;
    if (c.rank() == 0) {
      c.barrier();
      c.isend(&v, sizeof v, 1, 1).wait();
    } else {
      const void* data = nullptr;
      std::shared_ptr<void> lease;
      Request r = c.irecv_borrow(nullptr, sizeof v, 0, 1, &data, &lease);
      lease.reset();
      c.barrier();
      r.wait();
      EXPECT_NE(data, nullptr);
    }
  });
}

// A size mismatch fails both sides, as with irecv.
TEST(ThreadsBorrow, SizeMismatchFailsBothSides) {
  ThreadWorld::run(2, [](Communicator& c) {
    int v[2] = {1, 2};
    if (c.rank() == 0) {
      std::string msg = suite::comm_error_of([&] { c.isend(v, sizeof v, 1, 2).wait(); }, "send");
      suite::expect_contains(msg, "message size mismatch");
    } else {
      const void* data = nullptr;
      std::shared_ptr<void> lease;
      std::string msg = suite::comm_error_of(
          [&] { c.irecv_borrow(nullptr, sizeof(int), 0, 2, &data, &lease).wait(); }, "recv");
      suite::expect_contains(msg, "message size mismatch");
    }
    c.barrier();  // the world is still usable
  });
}

// A send whose buffer stays borrowed past the deadline times out, saying why.
TEST(ThreadsBorrow, LentSendTimesOutNamingTheBorrow) {
  ThreadWorld::run(
      2,
      [](Communicator& c) {
        int v = 3;
        if (c.rank() == 0) {
          Request s = c.isend(&v, sizeof v, 1, 3);
          std::string msg = suite::comm_error_of([&] { s.wait(); }, "lent send");
          suite::expect_contains(msg, "timeout after 0.2 s: rank 0 waiting for send to rank 1");
          suite::expect_contains(msg, "still borrows");
        } else {
          const void* data = nullptr;
          std::shared_ptr<void> lease;
          c.irecv_borrow(nullptr, sizeof v, 0, 3, &data, &lease).wait();
          // Holds the lease until rank 0's timeout aborts the world (the barrier then fails;
          // its own deadline is later, so rank 0's timeout comes first).
          c.set_timeout(milliseconds(20000));
          suite::comm_error_of([&] { c.barrier(); }, "barrier after the abort");
          lease.reset();  // rank 0's request destructor waits for this
        }
      },
      milliseconds(200));
}

// A sender that unwinds while its buffer is borrowed aborts the world, so the borrower fails
// at once (and drops the lease while unwinding) instead of waiting for its deadline.
TEST(ThreadsBorrow, UnwindingLenderFailsTheBorrowerFast) {
  std::string seen;
  try {
    ThreadWorld::run(2, [&](Communicator& c) {
      if (c.rank() == 0) {
        std::vector<int> buf(100, 1);
        Request s = c.isend(buf.data(), buf.size() * sizeof(int), 1, 4);
        c.barrier();
        throw std::runtime_error("rank zero gives up");
      }
      const void* data = nullptr;
      std::shared_ptr<void> lease;
      c.irecv_borrow(nullptr, 100 * sizeof(int), 0, 4, &data, &lease).wait();
      c.barrier();
      seen = suite::comm_error_of([&] { c.barrier(); }, "barrier rank 0 never reaches");
      throw CommError(seen);
    });
    ADD_FAILURE() << "run() did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "rank zero gives up");
  }
  suite::expect_contains(seen, "rank 0 failed: rank 0 abandoned a send to rank 1 (tag 4)");
}

// A wrapper that does not borrow (CheckedCommunicator) receives copies through the same call.
TEST(ThreadsBorrow, CheckedCommunicatorCopies) {
  ThreadWorld::run(3, [](Communicator& c) {
    CheckedCommunicator checked(c);
    EXPECT_FALSE(checked.borrows());
    suite::borrow_ring(checked);
  });
}

// A thread that cannot be started (out of threads for the process or user) is a clean Error
// naming the rank, after the ranks already started are failed and joined; before the fix the
// joinable threads were destroyed and the process terminated. The hook stands in for
// std::thread's std::system_error (root ignores RLIMIT_NPROC, so the limit cannot simulate it).
TEST(ThreadWorldRun, FailedThreadStartIsACleanError) {
  ThreadWorld::thread_start_hook() = [](int rank) {
    if (rank == 5)
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                              "thread start");
  };
  std::atomic<int> started{0}, finished{0};
  try {
    ThreadWorld::run(
        8,
        [&](Communicator& c) {
          ++started;
          c.barrier();  // waits for ranks that never start: fails through the abort
          ++finished;
        },
        milliseconds(20000));
    ADD_FAILURE() << "no error";
  } catch (const CommError& e) {
    ADD_FAILURE() << "a started rank's error, not the start failure: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("could not start the thread of rank 5 of 8"),
              std::string::npos)
        << e.what();
  }
  ThreadWorld::thread_start_hook() = nullptr;
  EXPECT_EQ(started.load(), 5);
  EXPECT_EQ(finished.load(), 0);
  // The world works again without the hook.
  ThreadWorld::run(4, [](Communicator& c) { c.barrier(); });
}

}  // namespace
}  // namespace seqpar
