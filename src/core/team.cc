// The persistent thread team of each calling thread (include/seqpar/core/team.h).
//
// One loop at a time per team. Its chunks are claimed from `ticket_`, one 64-bit word holding the
// loop's generation (24 bits), its chunk count (20 bits) and the next chunk (20 bits): a worker
// that wakes late, after its loop ended and the next began, sees another generation in the
// word it would advance and claims nothing (a thread's first claim in a loop is a
// compare-and-swap of the whole word; while it holds a chunk not yet counted done the loop cannot
// end, so its next claims just add one). The caller publishes the loop's function before the word
// (release), a claim reads it after (acquire), and the caller cannot publish another loop before
// every chunk of this one is done, so a claimed chunk always runs the function of the loop whose
// word it advanced. Completion counts chunks, not threads: the caller waits for `done_` to reach
// the count, never for a worker that claimed none.
//
// Members of a TeamBoard claim chunks of each other's teams as the workers do (any number of late
// claimers is safe by the same word). While a loop is open its team is named in the owner's slot;
// a helper counts itself into the slot's visitors before it reads that name, and a team is not
// destroyed while its thread is on a board until the visitors are gone, so a helper never holds a
// destroyed team.
#include "seqpar/core/team.h"

#include <omp.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "seqpar/core/error.h"
#include "seqpar/core/trace.h"

namespace seqpar {
namespace {

std::atomic<int> g_team_threads{0};  // threads of every live team, callers included

#if defined(__x86_64__) || defined(__i386__)
inline void cpu_relax() { __builtin_ia32_pause(); }
#else
inline void cpu_relax() {}
#endif

// Pauses a thread spins through before it sleeps on a futex, as libgomp's GOMP_SPINCOUNT: 2^18
// (a few milliseconds on current x86 cores; a decoded token's loops are microseconds apart, and a
// worker woken from a futex arrives when the caller has done most of the chunks alone), or
// SEQPAR_TEAM_SPINS. While the process's teams hold more threads than the machine has cores,
// 1000 (spinning would take a core from a thread with work).
int spins_before_sleep() {
  static const int configured = [] {
    const char* v = std::getenv("SEQPAR_TEAM_SPINS");
    return v != nullptr ? std::max(0, std::atoi(v)) : 1 << 18;
  }();
  static const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return g_team_threads.load(std::memory_order_relaxed) > cores ? std::min(configured, 1000)
                                                                : configured;
}
constexpr int kGenBits = 24, kCountBits = 20;
constexpr int64_t kFieldMask = (int64_t{1} << kCountBits) - 1;
// Chunks a loop counts in its word (more are grouped): half the field, so that the next chunk
// may run past the count by one per thread (kMaxThreads) without a carry.
constexpr int64_t kMaxChunks = int64_t{1} << (kCountBits - 1);
constexpr int kMaxThreads = 1 << 16;

constexpr uint64_t ticket(uint32_t gen, int64_t count, int64_t next) {
  return (uint64_t{gen & ((1u << kGenBits) - 1)} << (2 * kCountBits)) |
         (static_cast<uint64_t>(count) << kCountBits) | static_cast<uint64_t>(next);
}
constexpr uint32_t gen_of(uint64_t t) { return static_cast<uint32_t>(t >> (2 * kCountBits)); }
constexpr int64_t count_of(uint64_t t) {
  return static_cast<int64_t>((t >> kCountBits) & kFieldMask);
}
constexpr int64_t next_of(uint64_t t) { return static_cast<int64_t>(t & kFieldMask); }

std::atomic<int> g_enabled{-1};    // -1: SEQPAR_TEAM not read yet
std::atomic<unsigned> g_forks{0};  // fork()s of this process: a child's teams have no workers

// The chunks of one loop: each runs fn(ctx, i) unless an earlier one threw; the first exception
// is kept for the caller to rethrow once every chunk is done or skipped.
class Chunks {
 public:
  void reset() {
    error_ = nullptr;
    failed_.store(false, std::memory_order_relaxed);
  }
  void run(detail::ChunkFn fn, void* ctx, int64_t i) {
    if (failed_.load(std::memory_order_relaxed)) return;
    try {
      fn(ctx, i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::atomic<bool> failed_{false};
  std::mutex mu_;
  std::exception_ptr error_;
};

// The board the calling thread has joined (OnTeamBoard), none inside a chunk.
struct Membership {
  TeamBoard* board = nullptr;
  int member = 0;
};
thread_local Membership t_on;

class Team;

}  // namespace

struct TeamBoard::Slot {
  alignas(64) std::atomic<Team*> open{nullptr};  // the member's team while a loop is open
  alignas(64) std::atomic<int> visitors{0};      // helpers that may hold `open`'s team
};

namespace {

class Team {
 public:
  explicit Team(int threads) : threads_(threads) {
    g_team_threads.fetch_add(threads);
    try {
      workers_.reserve(static_cast<size_t>(threads - 1));
      // A worker starting late must still see the first loop: it waits for a generation past 0.
      for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { serve(0); });
    } catch (...) {  // a thread that could not start: the others stop before the error leaves
      stop_and_join();
      throw;
    }
  }
  ~Team() { stop_and_join(); }
  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;

  int threads() const { return threads_; }

  // Chunks [0, n) of fn; n < kMaxChunks. The first exception is rethrown after all are done.
  // With `slot` (the caller's on a board), the loop is named there while it is open.
  void run(int64_t n, detail::ChunkFn fn, void* ctx, TeamBoard::Slot* slot) {
    fn_ = fn;
    ctx_ = ctx;
    chunks_.reset();
    done_.store(0, std::memory_order_relaxed);
    const uint32_t g = gen_.load(std::memory_order_relaxed) + 1;
    ticket_.store(ticket(g, n, 0), std::memory_order_release);
    gen_.store(g, std::memory_order_release);
    gen_.notify_all();
    if (slot != nullptr) slot->open.store(this);
    // The caller's chunks run with OpenMP's thread count at 1 and off the board, as the workers'
    // and the helpers' do: inside a chunk loop_threads() is 1 and oneDNN single-threaded.
    const Membership on = std::exchange(t_on, {});
    const int omp_threads = omp_get_max_threads();
    omp_set_num_threads(1);
    work(g);
    omp_set_num_threads(omp_threads);
    t_on = on;
    if (slot != nullptr) slot->open.store(nullptr);
    for (int spins = 0, limit = spins_before_sleep();;) {
      const uint32_t d = done_.load(std::memory_order_acquire);
      if (d == static_cast<uint32_t>(n)) break;
      if (++spins < limit)
        cpu_relax();
      else
        done_.wait(d, std::memory_order_acquire);
    }
    chunks_.rethrow();
  }

  // A board member's help: chunks of the loop open now, if any are unclaimed. The number run.
  uint32_t help() { return work(gen_.load(std::memory_order_acquire)); }

 private:
  // Claims and runs chunks of generation g until none is left, then counts them done at once;
  // returns how many it ran.
  uint32_t work(uint32_t g) {
    const uint32_t mine = g & ((1u << kGenBits) - 1);
    // The first claim compares the whole word: since this thread saw g, the loop may have ended
    // and another begun.
    uint64_t t = ticket_.load(std::memory_order_acquire);
    for (;;) {
      if (gen_of(t) != mine || next_of(t) >= count_of(t)) return 0;
      if (ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel,
                                        std::memory_order_acquire))
        break;
    }
    // Holding a chunk not yet counted done, the loop cannot end: the next claims just add one
    // (past the count by at most one per thread, which the next field has room for).
    const int64_t n = count_of(t);
    uint32_t ran = 0;
    for (int64_t i = next_of(t); i < n;
         i = next_of(ticket_.fetch_add(1, std::memory_order_acq_rel))) {
      ++ran;
      chunks_.run(fn_, ctx_, i);
    }
    if (done_.fetch_add(ran, std::memory_order_acq_rel) + ran == n) done_.notify_one();
    return ran;
  }

  void stop_and_join() {
    stop_.store(true, std::memory_order_relaxed);
    gen_.fetch_add(1, std::memory_order_release);
    gen_.notify_all();
    for (std::thread& w : workers_) w.join();
    g_team_threads.fetch_sub(threads_);
  }

  // The worker's loop: waits for a generation past `seen`, works on it.
  void serve(uint32_t seen) {
    omp_set_num_threads(1);  // oneDNN inside a chunk: one thread
    for (;;) {
      uint32_t g;
      const int limit = spins_before_sleep();
      for (int spins = 0; (g = gen_.load(std::memory_order_acquire)) == seen;) {
        if (++spins < limit)
          cpu_relax();
        else
          gen_.wait(seen, std::memory_order_acquire);
      }
      if (stop_.load(std::memory_order_relaxed)) return;
      seen = g;
      work(g);
    }
  }

  const int threads_;
  std::vector<std::thread> workers_;
  // Each counter on its own cache line: claims, completions and wake-ups do not share one.
  alignas(64) std::atomic<uint32_t> gen_{0};     // the newest loop; workers wait on it
  alignas(64) std::atomic<uint64_t> ticket_{0};  // generation | count | next chunk
  alignas(64) std::atomic<uint32_t> done_{0};    // chunks of the current loop done or skipped
  alignas(64) Chunks chunks_;
  std::atomic<bool> stop_{false};
  detail::ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
};

struct TeamSlot {
  std::unique_ptr<Team> team;
  unsigned forks = 0;
  ~TeamSlot() {
    // In a forked child the workers do not exist: the team is dropped without joining them.
    if (forks != g_forks.load()) static_cast<void>(team.release());
  }
};

// Until no helper may hold the team a slot named (it names none now).
void wait_for_visitors(TeamBoard::Slot& s) {
  while (s.visitors.load() != 0) cpu_relax();
}

// The calling thread's team of `threads` threads, built or rebuilt as needed.
Team& team_of_this_thread(int threads) {
  static const int registered = [] {
    pthread_atfork(nullptr, nullptr, [] { g_forks.fetch_add(1); });
    return 0;
  }();
  static_cast<void>(registered);
  thread_local TeamSlot slot;
  const unsigned forks = g_forks.load(std::memory_order_relaxed);
  if (slot.forks != forks) {
    static_cast<void>(slot.team.release());
    slot.forks = forks;
  }
  if (!slot.team || slot.team->threads() != threads) {
    if (t_on.board != nullptr) wait_for_visitors(t_on.board->slot(t_on.member));
    slot.team.reset();
    slot.team = std::make_unique<Team>(threads);
  }
  return *slot.team;
}

// The loop as one OpenMP region (SEQPAR_TEAM=0): chunks handed out one at a time, the first
// exception rethrown after the region.
void omp_parallel_for(int64_t n, int threads, detail::ChunkFn fn, void* ctx) {
  Chunks chunks;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) chunks.run(fn, ctx, i);
  chunks.rethrow();
}

}  // namespace

int parallel_threads() { return omp_in_parallel() ? 1 : omp_get_max_threads(); }

int loop_threads() {
  if (omp_in_parallel()) return 1;
  return omp_get_max_threads() + (t_on.board != nullptr ? t_on.board->members() - 1 : 0);
}

TeamBoard::TeamBoard(int members)
    : members_(std::max(1, members)), slots_(std::make_unique<Slot[]>(members_)) {}

TeamBoard::~TeamBoard() = default;

TeamBoard::Slot& TeamBoard::slot(int member) { return slots_[member]; }

OnTeamBoard::OnTeamBoard(TeamBoard& board, int member) {
  static const bool help = [] {
    const char* v = std::getenv("SEQPAR_TEAM_HELP");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  if (help) t_on = {&board, member};
}

OnTeamBoard::~OnTeamBoard() {
  // The slot names no team between loops; a helper that read it during the last one may still
  // hold the team, which the thread's exit would destroy.
  if (t_on.board != nullptr) wait_for_visitors(t_on.board->slot(t_on.member));
  t_on = {};
}

BoardHelp help_on_board() {
  const Membership on = t_on;
  if (on.board == nullptr || omp_in_parallel()) return BoardHelp::kIdle;
  const int members = on.board->members();
  uint32_t ran = 0;
  bool open = false;
  for (int i = 1; i < members; ++i) {
    const int owner = (on.member + i) % members;
    TeamBoard::Slot& s = on.board->slot(owner);
    if (s.open.load(std::memory_order_relaxed) == nullptr) continue;
    struct Visit {  // counted out however the visit ends
      std::atomic<int>& visitors;
      explicit Visit(std::atomic<int>& v) : visitors(v) { visitors.fetch_add(1); }
      ~Visit() { visitors.fetch_sub(1); }
    } visit(s.visitors);
    if (Team* team = s.open.load()) {
      open = true;
      const double t0 = trace::enabled() ? trace::now_us() : 0;
      t_on = {};
      const int omp_threads = omp_get_max_threads();
      omp_set_num_threads(1);
      const uint32_t n = team->help();
      omp_set_num_threads(omp_threads);
      t_on = on;
      if (n > 0 && trace::enabled())
        trace::complete(detail::concat("help rank ", owner), "team", trace::Lane::kCompute, t0,
                        trace::now_us(), {{"chunks", n}});
      ran += n;
    }
  }
  return ran > 0 ? BoardHelp::kHelped : open ? BoardHelp::kBusy : BoardHelp::kIdle;
}

bool team_enabled() {
  int e = g_enabled.load(std::memory_order_relaxed);
  if (e < 0) {
    const char* v = std::getenv("SEQPAR_TEAM");
    e = v != nullptr && std::strcmp(v, "0") == 0 ? 0 : 1;
    g_enabled.store(e, std::memory_order_relaxed);
  }
  return e == 1;
}

void set_team_enabled(bool enabled) { g_enabled.store(enabled ? 1 : 0); }

namespace detail {

void parallel_for(int64_t n, ChunkFn fn, void* ctx) {
  if (n <= 0) return;
  const int threads = parallel_threads();
  TeamBoard::Slot* slot = t_on.board != nullptr && t_on.board->members() > 1 && !omp_in_parallel()
                              ? &t_on.board->slot(t_on.member)
                              : nullptr;
  if ((threads == 1 && slot == nullptr) || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(ctx, i);
    return;
  }
  if (!team_enabled()) return omp_parallel_for(n, threads, fn, ctx);
  Team& team = team_of_this_thread(std::min(threads, kMaxThreads));
  if (n < kMaxChunks) return team.run(n, fn, ctx, slot);
  // More chunks than a ticket counts: each claim runs a group of consecutive ones.
  struct Grouped {
    int64_t n, per;
    ChunkFn fn;
    void* ctx;
  } g{n, (n + kMaxChunks - 2) / (kMaxChunks - 1), fn, ctx};
  team.run((n + g.per - 1) / g.per,
           [](void* c, int64_t i) {
             const auto& gr = *static_cast<Grouped*>(c);
             for (int64_t j = i * gr.per; j < std::min(gr.n, (i + 1) * gr.per); ++j)
               gr.fn(gr.ctx, j);
           },
           &g, slot);
}

}  // namespace detail
}  // namespace seqpar
