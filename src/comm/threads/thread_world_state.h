// The shared state of a ThreadWorld: the world-wide abort flag, the point-to-point matching
// queues and the groups (world and splits) with their collective rendezvous. Private to
// src/comm/threads/.
//
// Synchronization: one mutex and one condition variable per world guard every field below
// (except `aborted`, also readable without the lock as a fast-path hint). Data never moves under
// the lock: a matched send/recv pair is marked kCopying, the copy runs unlocked, then both are
// marked kDone (or, for a borrowing receive, no data moves at all: the receiver reads the send
// buffer in place until it releases it); collectives read peers' buffers between two rendezvous of their group.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "seqpar/comm/communicator.h"
#include "seqpar/core/team.h"

namespace seqpar {

// One pending isend or irecv.
//   kPosted -> kCopying -> kDone: matched, the op posted second copies (unlocked), both done.
//   kPosted -> kDone (recv) + kLent (send): matched by irecv_borrow. No copy: the receiver gets
//     the send buffer's address; the send stays kLent until the receiver drops its lease, then
//     kDone.
struct ThreadP2pOp {
  enum class State { kPosted, kCopying, kLent, kDone, kFailed };
  bool is_send = false;
  const void* send_buf = nullptr;  // is_send
  void* recv_buf = nullptr;        // !is_send
  bool borrow = false;             // !is_send: irecv_borrow
  const void** borrowed = nullptr;  // borrow: where the sender's address goes when matched
  std::shared_ptr<ThreadP2pOp> lender;  // borrow, matched: the kLent send, until released
  bool lease_dropped = false;           // borrow: the receiver no longer reads (lease gone)
  size_t bytes = 0;
  uint64_t group_id = 0;
  int src = 0, dst = 0, tag = 0;  // ranks in the group
  State state = State::kPosted;
  std::string error;  // kFailed
};

// Matching queue of one (group, src, dst, tag): FIFO on both sides; at most one side non-empty.
struct ThreadChannel {
  std::deque<std::shared_ptr<ThreadP2pOp>> sends;
  std::deque<std::shared_ptr<ThreadP2pOp>> recvs;
};

// What a rank brings to a collective, published at its first rendezvous.
struct CollSlot {
  OpKind kind = OpKind::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t bytes = 0;                     // all_gather, all_to_all, broadcast
  std::span<const size_t> counts;       // all_gatherv (all), all_to_allv (send counts)
  std::span<const size_t> recv_counts;  // all_to_allv
  size_t n = 0;                         // all_reduce
  Communicator::Elem elem = Communicator::Elem::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;            // broadcast
  int color = 0, key = 0;  // split
};

// A group of ranks (the world or one color of a split) shared by its members' communicators.
struct ThreadGroup {
  uint64_t id = 0;
  std::vector<int> world_ranks;  // member i -> world rank
  // Collective rendezvous.
  std::vector<CollSlot> slots;     // member i's slot of the current collective
  std::vector<uint64_t> arrivals;  // rendezvous each member has entered (to name late ranks)
  int arrived = 0;                 // members at the current rendezvous
  uint64_t generation = 0;         // completed rendezvous
  std::string mismatch;            // set by the last arriver of a first rendezvous, if any

  int size() const { return static_cast<int>(world_ranks.size()); }
};

class ThreadWorldState {
 public:
  ThreadWorldState(int size, std::chrono::milliseconds timeout);

  // Marks the world failed (first call wins) and wakes every waiter. Never throws.
  void abort(int world_rank, const std::string& message);
  void abort_locked(int world_rank, const std::string& message);
  // "rank R failed: message" of the first abort. Requires the lock and aborted.
  std::string failure_locked() const;

  const int size;
  const std::chrono::milliseconds timeout;

  std::mutex mu;
  std::condition_variable cv;
  // Bumped (under mu) by notify_all_locked, readable without the lock.
  std::atomic<uint64_t> events{0};
  // How long a waiter watches `events` before it sleeps on cv: a sleep and its wake-up cost tens
  // of microseconds, which a tensor-parallel decode step pays at each of its all-reduces. Zero
  // when the world has more ranks than this process has CPUs (a spinning rank would hold a core
  // another rank needs).
  const int64_t spin_ns;

  // Wakes every waiter (under mu).
  void notify_all_locked() {
    events.fetch_add(1, std::memory_order_release);
    cv.notify_all();
  }
  // The ranks' loops (core/team.h): each rank's thread is a member while it runs, where the
  // world's waits spin (spin_ns > 0; they help only while they spin).
  TeamBoard board{size};

  // With lk holding mu: spins for up to spin_ns, dropping the lock while it watches for the next
  // notify_all_locked, until done() (evaluated under the lock). Returns with lk held; the caller
  // checks its condition again (and sleeps on cv if it still waits). While it spins it runs
  // unclaimed chunks of the loops other ranks have open (help_on_board): a rank that waits for a
  // slower or descheduled one takes that rank's share. While another rank has a loop open it
  // spins on, up to kBusySpin, to help with that rank's next loop too (a sleeping rank would not
  // see it).
  static constexpr std::chrono::milliseconds kBusySpin{100};
  template <typename Done>
  void spin_until(std::unique_lock<std::mutex>& lk, Done&& done);
  std::atomic<bool> aborted{false};
  int abort_rank = -1;
  std::string abort_message;

  using ChannelKey = std::tuple<uint64_t, int, int, int>;  // group, src, dst, tag
  std::map<ChannelKey, ThreadChannel> channels;

  // Groups being created by a split: (parent group, split number, color) -> group, fetches left.
  using SplitKey = std::tuple<uint64_t, uint64_t, int>;
  std::map<SplitKey, std::pair<std::shared_ptr<ThreadGroup>, int>> pending_splits;
  uint64_t next_group_id = 1;

  std::shared_ptr<ThreadGroup> world_group;
  std::vector<bool> handed_out;  // communicator(r) already called
};

// A pause in a spin loop: tells the core this thread waits (x86's PAUSE).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

template <typename Done>
void ThreadWorldState::spin_until(std::unique_lock<std::mutex>& lk, Done&& done) {
  if (spin_ns == 0) return;
  const auto start = std::chrono::steady_clock::now();
  const auto busy_cap =
      start + std::max<std::chrono::nanoseconds>(kBusySpin, std::chrono::nanoseconds(spin_ns));
  auto until = start + std::chrono::nanoseconds(spin_ns);
  bool expired = false;
  while (!expired && !done()) {
    const uint64_t seen = events.load(std::memory_order_acquire);
    lk.unlock();
    for (int i = 1; events.load(std::memory_order_acquire) == seen; ++i) {
      const BoardHelp help = help_on_board();
      if (help != BoardHelp::kIdle) {
        const auto now = std::chrono::steady_clock::now();
        if (now < busy_cap) until = std::max(until, now + std::chrono::nanoseconds(spin_ns));
        if (help == BoardHelp::kHelped) continue;
      }
      cpu_relax();
      if (i % 64 == 0 && std::chrono::steady_clock::now() > until) {
        expired = true;
        break;
      }
    }
    lk.lock();
  }
}

}  // namespace seqpar
