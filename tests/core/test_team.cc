// The rank's thread team (core/team.h): every chunk of every loop exactly once, on at most the
// team's threads, loops nested in a chunk run in order on its thread, the first exception
// rethrown and the team usable after it, one team per calling thread, rebuilt when the thread
// count changes, and usable in a forked child; on a TeamBoard, a member's open loop's chunks run
// on another member that helps, its exceptions reach the owner, and many members' loops at once
// each run whole. The oracle is counting: each chunk records itself.
#include <gtest/gtest.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "seqpar/core/team.h"

namespace seqpar {
namespace {

// Under ThreadSanitizer the OpenMP-region form is not run (libgomp is not instrumented, so its
// joins are invisible to TSan) and neither is fork (TSan stops a child that starts threads).
#if defined(__SANITIZE_THREAD__)
constexpr bool kTsan = true;
#else
constexpr bool kTsan = false;
#endif

// Sets the calling thread's OpenMP thread count (the team's size) for one test.
class Threads {
 public:
  explicit Threads(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~Threads() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

// Runs a loop of n chunks and checks each ran exactly once, on at most `threads` threads.
void expect_every_chunk_once(int64_t n, int threads) {
  std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
  std::mutex mu;
  std::set<std::thread::id> ids;
  parallel_for(n, [&](int64_t i) {
    runs[static_cast<size_t>(i)].fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(runs[static_cast<size_t>(i)].load(), 1) << "chunk " << i << " of " << n;
  EXPECT_LE(static_cast<int>(ids.size()), threads);
}

TEST(Team, EveryChunkOnce) {
  for (bool team : {true, false}) {
    if (!team && kTsan) continue;
    set_team_enabled(team);
    for (int threads : {1, 2, 3, 4}) {
      Threads t(threads);
      EXPECT_EQ(parallel_threads(), threads);
      for (int64_t n : {0, 1, 2, 3, 7, 64, 1000, 100003}) expect_every_chunk_once(n, threads);
    }
  }
  set_team_enabled(true);
}

// Around the chunks one loop's counter holds (2^19 - 1; more are claimed in groups): each once.
TEST(Team, MoreChunksThanTheCounterHolds) {
  Threads t(2);
  for (int64_t n : {(int64_t{1} << 19) - 1, int64_t{1} << 19, (int64_t{1} << 20) + 5})
    expect_every_chunk_once(n, 2);
}

// Thousands of short loops one after another: a worker that wakes late for a finished loop must
// claim nothing of the next.
TEST(Team, ManyShortLoops) {
  Threads t(3);
  std::atomic<int64_t> sum{0};
  int64_t expected = 0;
  for (int loop = 0; loop < 20000; ++loop) {
    const int64_t n = 1 + loop % 5;
    parallel_for(n, [&](int64_t i) { sum.fetch_add(loop * 8 + i, std::memory_order_relaxed); });
    for (int64_t i = 0; i < n; ++i) expected += loop * 8 + i;
  }
  EXPECT_EQ(sum.load(), expected);
}

// Returns once two threads have called it with `arrived` (two chunks that meet finish only if
// two threads run them at once).
void meet(std::atomic<int>& arrived) {
  arrived.fetch_add(1);
  for (int seen = arrived.load(); seen < 2; seen = arrived.load()) arrived.wait(seen);
  arrived.notify_all();
}

// Two chunks that wait for each other finish only if two threads run them at once: the team
// runs its chunks concurrently (a team that ran them in turn would hang here).
TEST(Team, ChunksRunConcurrently) {
  Threads t(2);
  std::atomic<int> arrived{0};
  parallel_for(2, [&](int64_t) { meet(arrived); });
  EXPECT_EQ(arrived.load(), 2);
}

// Inside a chunk: one thread, nested loops in order on the chunk's thread, and OpenMP's thread
// count 1 (oneDNN called there runs single-threaded). The two chunks meet first, so that one runs
// on the caller and one on a worker.
TEST(Team, NestedLoopsRunInOrderOnTheChunksThread) {
  Threads t(2);
  std::atomic<int> arrived{0};
  std::vector<std::vector<int64_t>> order(2);
  std::vector<int> inner_threads(2), omp_threads(2);
  std::vector<bool> same_thread(2, true);
  parallel_for(2, [&](int64_t c) {
    meet(arrived);
    inner_threads[c] = parallel_threads();
    omp_threads[c] = omp_get_max_threads();
    const std::thread::id me = std::this_thread::get_id();
    parallel_for(5, [&](int64_t i) {
      order[c].push_back(i);
      if (std::this_thread::get_id() != me) same_thread[c] = false;
    });
  });
  for (int c = 0; c < 2; ++c) {
    EXPECT_EQ(order[c], (std::vector<int64_t>{0, 1, 2, 3, 4})) << "chunk " << c;
    EXPECT_TRUE(same_thread[c]);
    EXPECT_EQ(inner_threads[c], 1);
    EXPECT_EQ(omp_threads[c], 1);
  }
  EXPECT_EQ(omp_get_max_threads(), 2);  // the caller's count restored after its chunks
}

TEST(Team, RethrowsAndStaysUsable) {
  for (bool team : {true, false}) {
    if (!team && kTsan) continue;
    set_team_enabled(team);
    Threads t(2);
    for (int64_t bad : {0, 5, 99}) {
      EXPECT_THROW(parallel_for(100,
                                [&](int64_t i) {
                                  if (i == bad) throw std::runtime_error("chunk failed");
                                }),
                   std::runtime_error);
      expect_every_chunk_once(100, 2);
    }
  }
  set_team_enabled(true);
}

// A team per calling thread (ranks as threads): four threads' loops at once, each its own sums.
TEST(Team, OnePerCallingThread) {
  std::vector<int64_t> sums(4, 0);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.emplace_back([&sums, r] {
      omp_set_num_threads(2);
      std::atomic<int64_t> sum{0};
      for (int loop = 0; loop < 2000; ++loop)
        parallel_for(16, [&](int64_t i) { sum.fetch_add(r * 1000 + i); });
      sums[r] = sum.load();
    });
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < 4; ++r) EXPECT_EQ(sums[r], 2000 * (16 * r * 1000 + 120)) << "rank " << r;
}

// The team follows the thread count: 4, then 2, then 3 threads.
TEST(Team, RebuiltWhenTheThreadCountChanges) {
  for (int threads : {4, 2, 3}) {
    Threads t(threads);
    expect_every_chunk_once(5000, threads);
  }
}

// A child forked after the parent's team started has none of its workers: its loops still run.
TEST(Team, ForkedChildRunsLoops) {
  if (kTsan) GTEST_SKIP() << "ThreadSanitizer stops a forked child that starts threads";
  Threads t(2);
  expect_every_chunk_once(100, 2);
  const pid_t child = fork();
  ASSERT_NE(child, -1);
  if (child == 0) {
    std::atomic<int64_t> sum{0};
    parallel_for(100, [&](int64_t i) { sum.fetch_add(i); });
    _exit(sum.load() == 4950 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// On a board of two members of one thread each (no workers): owner() on member 0, and help()
// again and again on member 1 until owner() has returned.
void two_members(const std::function<void()>& owner, const std::function<void()>& help) {
  TeamBoard board(2);
  std::atomic<bool> owner_done{false};
  std::thread first([&] {
    omp_set_num_threads(1);
    OnTeamBoard on(board, 0);
    owner();
    owner_done.store(true);
  });
  std::thread second([&] {
    omp_set_num_threads(1);
    OnTeamBoard on(board, 1);
    while (!owner_done.load()) help();
  });
  first.join();
  second.join();
}

// Member 0's loop of two chunks that meet ends only if member 1, helping, runs one. Outside a
// chunk member 0's loops are chunked for 2 threads, inside for 1; a thread on no board finds
// nothing to help.
TEST(Board, AHelpingMemberRunsAnOpenLoopsChunks) {
  EXPECT_EQ(help_on_board(), BoardHelp::kIdle);
  EXPECT_EQ(loop_threads(), parallel_threads());
  std::atomic<int> arrived{0};
  std::vector<std::thread::id> ran_on(2);
  std::vector<int> inside(2);
  std::thread::id owner_id, helper_id;
  int outside = 0, helped = 0;
  two_members(
      [&] {
        owner_id = std::this_thread::get_id();
        outside = loop_threads();
        parallel_for(2, [&](int64_t c) {
          meet(arrived);
          ran_on[c] = std::this_thread::get_id();
          inside[c] = loop_threads();
        });
      },
      [&] {
        helper_id = std::this_thread::get_id();
        if (help_on_board() == BoardHelp::kHelped) ++helped;
      });
  EXPECT_EQ(outside, 2);
  EXPECT_EQ(inside, (std::vector<int>{1, 1}));
  EXPECT_EQ(helped, 1);
  EXPECT_TRUE((ran_on[0] == owner_id && ran_on[1] == helper_id) ||
              (ran_on[0] == helper_id && ran_on[1] == owner_id));
}

// A chunk that throws on the helping member: the owner's parallel_for rethrows it, the helper
// goes on, and the owner's next loops (helped as well) run every chunk once.
TEST(Board, AHelpedChunksExceptionReachesTheOwner) {
  std::atomic<int> arrived{0};
  bool owner_caught = false, helper_caught = false;
  two_members(
      [&] {
        const std::thread::id me = std::this_thread::get_id();
        try {
          parallel_for(2, [&](int64_t) {
            meet(arrived);
            if (std::this_thread::get_id() != me) throw std::runtime_error("helped chunk failed");
          });
        } catch (const std::runtime_error&) {
          owner_caught = true;
        }
        expect_every_chunk_once(1000, 2);
      },
      [&] {
        try {
          help_on_board();
        } catch (...) {
          helper_caught = true;
        }
      });
  EXPECT_TRUE(owner_caught);
  EXPECT_FALSE(helper_caught);
}

// Four members (teams of 1 and 2 threads) each run thousands of short loops and help between
// them, then help until every member is done: each member's sums are its own, whole.
TEST(Board, ManyMembersLoopsAtOnce) {
  constexpr int kMembers = 4, kLoops = 3000;
  TeamBoard board(kMembers);
  std::atomic<int> done{0};
  std::vector<int64_t> sums(kMembers, 0), expected(kMembers, 0);
  std::vector<std::thread> members;
  for (int r = 0; r < kMembers; ++r)
    members.emplace_back([&, r] {
      omp_set_num_threads(1 + r % 2);
      OnTeamBoard on(board, r);
      std::atomic<int64_t> sum{0};
      for (int loop = 0; loop < kLoops; ++loop) {
        const int64_t n = 1 + (loop + r) % 7;
        parallel_for(n, [&](int64_t i) { sum.fetch_add(r * 1000 + i + 1); });
        expected[r] += n * r * 1000 + n * (n + 1) / 2;
        if (loop % 3 == r % 3) help_on_board();
      }
      sums[r] = sum.load();
      done.fetch_add(1);
      while (done.load() < kMembers) help_on_board();
    });
  for (std::thread& t : members) t.join();
  for (int r = 0; r < kMembers; ++r) EXPECT_EQ(sums[r], expected[r]) << "member " << r;
}

}  // namespace
}  // namespace seqpar
