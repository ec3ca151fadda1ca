// threads backend: ranks are threads of one process. Point-to-point is a rendezvous (whichever of
// isend/irecv is posted second copies straight from the sender's buffer into the receiver's);
// collectives publish their buffers, meet at a rendezvous of their group, copy what they need
// from peers' buffers in place, and meet again before returning. No staging copies.
#include <cxxabi.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <thread>

#include "op_rules.h"
#include "seqpar/comm/threads.h"
#include "seqpar/core/limits.h"
#include "seqpar/core/trace.h"
#include "threads/thread_world_state.h"
#include "trace_op.h"

namespace seqpar {

namespace rules = comm_rules;
using Clock = std::chrono::steady_clock;
using State = ThreadP2pOp::State;

// ---------------------------------------------------------------------------------------------
// World state

namespace {

// The CPUs this process may run on.
int usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// How long a waiter spins before it sleeps (ThreadWorldState::spin_ns): SEQPAR_SPIN_US when set,
// else 100 us while the world has no more ranks than this process has CPUs, else 0. Measured on
// 2 cores (bench/comm_bench): an all-reduce of 2048 floats on 2 ranks 62-72 -> 2.2-2.4 us.
int64_t spin_ns_for(int size) {
  constexpr int64_t kDefaultUs = 100, kMaxUs = 1'000'000;
  const char* env = std::getenv("SEQPAR_SPIN_US");
  if (env == nullptr || *env == '\0') return size <= usable_cpus() ? kDefaultUs * 1000 : 0;
  errno = 0;
  char* end = nullptr;
  const long long us = std::strtoll(env, &end, 10);
  const bool digits = env[0] >= '0' && env[0] <= '9' && *end == '\0';
  SEQPAR_ARG_CHECK(digits && errno == 0 && us <= kMaxUs, "SEQPAR_SPIN_US='",
                   std::string(env).substr(0, 32),
                   "' is not valid: expected whole microseconds from 0 (never spin) to ", kMaxUs);
  return us * 1000;
}

}  // namespace

ThreadWorldState::ThreadWorldState(int size, std::chrono::milliseconds timeout)
    : size(size),
      timeout(timeout),
      spin_ns(spin_ns_for(size)),
      handed_out(static_cast<size_t>(size), false) {
  world_group = std::make_shared<ThreadGroup>();
  world_group->id = next_group_id++;
  for (int r = 0; r < size; ++r) world_group->world_ranks.push_back(r);
  world_group->slots.resize(static_cast<size_t>(size));
  world_group->arrivals.resize(static_cast<size_t>(size));
}

void ThreadWorldState::abort(int world_rank, const std::string& message) {
  std::lock_guard<std::mutex> lk(mu);
  abort_locked(world_rank, message);
}

void ThreadWorldState::abort_locked(int world_rank, const std::string& message) {
  if (!aborted.load()) {
    abort_rank = world_rank;
    abort_message = message;
    aborted.store(true);
  }
  notify_all_locked();
}

std::string ThreadWorldState::failure_locked() const {
  return rules::peer_failed_message(abort_rank, abort_message);
}

namespace {

// Checks that every member called the same collective with matching sizes. Runs once per
// collective, under the world lock, in the last member to arrive. Returns "" or the error.
std::string check_slots(const ThreadGroup& g) {
  using detail::concat;
  const CollSlot& a = g.slots[0];
  const int n = g.size();
  std::vector<rules::CollectiveCall> calls;
  for (const CollSlot& s : g.slots)
    calls.push_back({s.kind, s.kind == OpKind::kAllReduce ? s.n : s.bytes, s.elem, s.op, s.root});
  if (std::string m = rules::collective_mismatch(calls); !m.empty()) return m;
  if (a.kind == OpKind::kAllGatherV) {
    for (int i = 1; i < n; ++i) {
      const CollSlot& b = g.slots[i];
      if (!std::equal(a.counts.begin(), a.counts.end(), b.counts.begin(), b.counts.end())) {
        return concat("all_gatherv counts mismatch: rank 0 has counts ",
                      rules::format_counts(a.counts), ", rank ", i, " has ",
                      rules::format_counts(b.counts));
      }
    }
  }
  if (a.kind == OpKind::kAllToAllV) {
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        const size_t sent = g.slots[i].counts[j], expected = g.slots[j].recv_counts[i];
        if (sent != expected) {
          return concat("all_to_allv count mismatch: rank ", i, " sends ", sent, " bytes to rank ",
                        j, ", rank ", j, " expects ", expected, " from rank ", i);
        }
      }
    }
  }
  return "";
}

template <typename T>
void reduce_segment(const std::vector<const T*>& in, T* out, size_t begin, size_t end,
                    ReduceOp op) {
  constexpr size_t kChunk = 1024;
  T acc[kChunk];
  for (size_t c = begin; c < end; c += kChunk) {
    const size_t m = std::min(kChunk, end - c);
    std::memcpy(acc, in[0] + c, m * sizeof(T));
    for (size_t j = 1; j < in.size(); ++j) {
      const T* p = in[j] + c;
      if (op == ReduceOp::kSum) {
        for (size_t k = 0; k < m; ++k) acc[k] += p[k];
      } else {
        for (size_t k = 0; k < m; ++k) acc[k] = p[k] > acc[k] ? p[k] : acc[k];
      }
    }
    std::memcpy(out + c, acc, m * sizeof(T));
  }
}

// ---------------------------------------------------------------------------------------------
// Requests

class ThreadRequest final : public RequestImpl {
 public:
  ThreadRequest(std::shared_ptr<ThreadWorldState> world, std::shared_ptr<ThreadP2pOp> op,
                std::shared_ptr<rules::StatsLink> link, std::chrono::milliseconds timeout,
                int world_rank, std::string who)
      : world_(std::move(world)),
        op_(std::move(op)),
        link_(std::move(link)),
        timeout_(timeout),
        world_rank_(world_rank),
        who_(std::move(who)) {}

  ~ThreadRequest() override {
    // Never leave a posted op behind: a peer must not copy into or out of a buffer whose owner
    // stopped waiting for it (e.g. unwound by an exception).
    std::unique_lock<std::mutex> lk(world_->mu);
    if (op_->state == State::kPosted) {
      unlink_locked();
      op_->state = State::kFailed;
      op_->error = "request destroyed before completion";
    }
    if (op_->state == State::kLent && !world_->aborted.load()) {
      // A peer still reads this send's buffer in place, and its owner is unwinding: make the
      // borrower fail fast (it releases while unwinding) instead of waiting for its deadline.
      world_->abort_locked(world_rank_,
                           detail::concat(who_, " abandoned a ", describe(),
                                          " while the receiver still borrowed its buffer"));
    }
    world_->cv.wait(lk,
                    [&] { return op_->state != State::kCopying && op_->state != State::kLent; });
  }

  void wait() override {
    {
      std::unique_lock<std::mutex> lk(world_->mu);
      if (done_or_throw_locked()) return;
    }
    trace::Scope span(trace::enabled() ? wait_name() : std::string(), "comm", trace::Lane::kComm);
    span.arg("bytes", static_cast<int64_t>(op_->bytes));
    rules::WaitClock clock(link_->stats);
    const auto deadline = Clock::now() + timeout_;
    std::unique_lock<std::mutex> lk(world_->mu);
    world_->spin_until(lk, [&] {
      return op_->state == State::kDone || op_->state == State::kFailed || world_->aborted.load();
    });
    while (true) {
      if (done_or_throw_locked()) return;
      if (op_->state == State::kCopying) {  // a bounded memcpy; wait for it past the deadline
        world_->cv.wait(lk);
        continue;
      }
      if (world_->cv.wait_until(lk, deadline) == std::cv_status::timeout &&
          (op_->state == State::kPosted || op_->state == State::kLent) && !world_->aborted.load()) {
        std::string msg = rules::timeout_message(
            timeout_, who_,
            op_->state == State::kLent ? describe() + " (the receiver still borrows the buffer)"
                                       : describe());
        // A lent buffer stays lent (the destructor waits for its release); a posted op fails.
        if (op_->state == State::kPosted) fail_locked(msg);
        world_->abort_locked(world_rank_, msg);
        throw CommTimeout(msg);
      }
    }
  }

  bool test() override {
    std::unique_lock<std::mutex> lk(world_->mu);
    return done_or_throw_locked();
  }

 private:
  // True if done; throws if failed or if the world aborted while the op is still unmatched
  // (or, for a send, still lent to a borrower).
  bool done_or_throw_locked() {
    if (op_->state == State::kDone) return true;
    if (op_->state == State::kFailed) throw CommError(op_->error);
    if (op_->state == State::kPosted && world_->aborted.load()) {
      std::string msg = world_->failure_locked();
      fail_locked(msg);
      throw CommError(msg);
    }
    if (op_->state == State::kLent && world_->aborted.load()) {
      throw CommError(world_->failure_locked());
    }
    return false;
  }

  std::string wait_name() const {
    return op_->is_send ? detail::concat("wait send to ", op_->dst)
                        : detail::concat("wait recv from ", op_->src);
  }

  void fail_locked(const std::string& msg) {
    unlink_locked();
    op_->state = State::kFailed;
    op_->error = msg;
  }

  void unlink_locked() {
    auto it = world_->channels.find({op_->group_id, op_->src, op_->dst, op_->tag});
    if (it == world_->channels.end()) return;
    auto& q = op_->is_send ? it->second.sends : it->second.recvs;
    q.erase(std::remove(q.begin(), q.end(), op_), q.end());
    if (it->second.sends.empty() && it->second.recvs.empty()) world_->channels.erase(it);
  }

  std::string describe() const {
    return op_->is_send ? detail::concat("send to rank ", op_->dst, " (tag ", op_->tag, ")")
                        : detail::concat("recv from rank ", op_->src, " (tag ", op_->tag, ")");
  }

  std::shared_ptr<ThreadWorldState> world_;
  std::shared_ptr<ThreadP2pOp> op_;
  std::shared_ptr<rules::StatsLink> link_;
  std::chrono::milliseconds timeout_;
  int world_rank_;
  std::string who_;  // "rank 1" or "rank 1 (world rank 3)"
};

// ---------------------------------------------------------------------------------------------
// Communicator

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadWorldState> world, std::shared_ptr<ThreadGroup> group,
                     int rank, std::chrono::milliseconds timeout)
      : world_(std::move(world)),
        group_(std::move(group)),
        rank_(rank),
        link_(std::make_shared<rules::StatsLink>()) {
    link_->stats = &stats_;
    timeout_ = timeout;
  }
  ~ThreadCommunicator() override { link_->stats = nullptr; }

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string backend() const override { return "threads"; }

  Request isend(const void* buf, size_t bytes, int dst, int tag) override;
  Request irecv(void* buf, size_t bytes, int src, int tag) override;
  Request irecv_borrow(void* buf, size_t bytes, int src, int tag, const void** data,
                       std::shared_ptr<void>* lease) override;
  bool borrows() const override { return true; }
  void all_gather(const void* send, size_t bytes, void* recv) override;
  void all_gatherv(const void* send, void* recv, std::span<const size_t> counts) override;
  void all_to_all(const void* send, void* recv, size_t bytes_per_rank) override;
  void all_to_allv(const void* send, std::span<const size_t> send_counts, void* recv,
                   std::span<const size_t> recv_counts) override;
  void all_reduce(void* buf, size_t n, Elem elem, ReduceOp op) override;
  using Communicator::all_reduce;
  void broadcast(void* buf, size_t bytes, int root) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  void abort(const std::string& message) override { world_->abort(world_rank(), message); }

 private:
  int world_rank() const { return group_->world_ranks[rank_]; }
  std::string who() const { return rules::rank_label(rank_, world_rank(), group_->id == 1); }
  void throw_if_aborted();
  // A point-to-point operation of this communicator's group, not yet posted.
  std::shared_ptr<ThreadP2pOp> new_op(size_t bytes, int src, int dst, int tag) const;
  Request post(std::shared_ptr<ThreadP2pOp> op);

  // Meets the other members of the group. With `publish`, first stores this rank's slot (the
  // first rendezvous of a collective), and fails on every member if the slots do not match.
  void rendezvous(Clock::time_point deadline, const CollSlot* publish);
  // Runs a collective: publish + rendezvous, then for each phase work(phase) and a rendezvous,
  // so that no rank leaves while a peer may still read its buffers.
  template <typename Work>
  void collective(const CollSlot& slot, int phases, Work&& work);

  std::shared_ptr<ThreadWorldState> world_;
  std::shared_ptr<ThreadGroup> group_;
  int rank_;
  std::shared_ptr<rules::StatsLink> link_;
  uint64_t splits_ = 0;  // splits done on this communicator (same on every member)
};

void ThreadCommunicator::throw_if_aborted() {
  if (!world_->aborted.load()) return;
  std::lock_guard<std::mutex> lk(world_->mu);
  throw CommError(world_->failure_locked());
}

std::shared_ptr<ThreadP2pOp> ThreadCommunicator::new_op(size_t bytes, int src, int dst,
                                                        int tag) const {
  auto op = std::make_shared<ThreadP2pOp>();
  op->bytes = bytes;
  op->group_id = group_->id;
  op->src = src;
  op->dst = dst;
  op->tag = tag;
  return op;
}

Request ThreadCommunicator::post(std::shared_ptr<ThreadP2pOp> op) {
  std::shared_ptr<ThreadP2pOp> peer;
  {
    std::lock_guard<std::mutex> lk(world_->mu);
    if (world_->aborted.load()) throw CommError(world_->failure_locked());
    auto key = ThreadWorldState::ChannelKey{op->group_id, op->src, op->dst, op->tag};
    ThreadChannel& ch = world_->channels[key];
    auto& theirs = op->is_send ? ch.recvs : ch.sends;
    auto& mine = op->is_send ? ch.sends : ch.recvs;
    if (theirs.empty()) {
      mine.push_back(op);
    } else {
      peer = std::move(theirs.front());
      theirs.pop_front();
      if (ch.sends.empty() && ch.recvs.empty()) world_->channels.erase(key);
      const ThreadP2pOp& s = op->is_send ? *op : *peer;
      const ThreadP2pOp& r = op->is_send ? *peer : *op;
      if (s.bytes != r.bytes) {
        std::string msg = detail::concat("message size mismatch: rank ", s.src, " sends ", s.bytes,
                                         " bytes to rank ", s.dst, " (tag ", s.tag, "), rank ",
                                         r.dst, " receives ", r.bytes);
        for (auto* p : {op.get(), peer.get()}) {
          p->state = State::kFailed;
          p->error = msg;
        }
        world_->notify_all_locked();
        peer.reset();
      } else if (r.borrow) {  // zero copy: hand the receiver the send buffer
        ThreadP2pOp& recv = op->is_send ? *peer : *op;
        ThreadP2pOp& send = op->is_send ? *op : *peer;
        *recv.borrowed = send.send_buf;
        if (recv.lease_dropped) {  // nobody will read it: nothing to lend
          send.state = State::kDone;
        } else {
          recv.lender = op->is_send ? op : peer;
          send.state = State::kLent;
        }
        recv.state = State::kDone;
        world_->notify_all_locked();
        peer.reset();
      } else {
        op->state = peer->state = State::kCopying;
      }
    }
  }
  if (peer) {  // posted second: do the copy, outside the lock
    const ThreadP2pOp& s = op->is_send ? *op : *peer;
    const ThreadP2pOp& r = op->is_send ? *peer : *op;
    if (s.bytes > 0) std::memcpy(r.recv_buf, s.send_buf, s.bytes);
    std::lock_guard<std::mutex> lk(world_->mu);
    op->state = peer->state = State::kDone;
    world_->notify_all_locked();
  }
  return Request(std::make_shared<ThreadRequest>(world_, std::move(op), link_, timeout(),
                                                 world_rank(), who()));
}

Request ThreadCommunicator::isend(const void* buf, size_t bytes, int dst, int tag) {
  rules::check_isend(buf, bytes, dst, tag, size());
  throw_if_aborted();
  rules::account_send(stats_, bytes, dst == rank_);
  auto op = new_op(bytes, rank_, dst, tag);
  op->is_send = true;
  op->send_buf = buf;
  return post(std::move(op));
}

Request ThreadCommunicator::irecv_borrow(void* buf, size_t bytes, int src, int tag,
                                         const void** data, std::shared_ptr<void>* lease) {
  rules::check_peer(src, size(), "irecv_borrow: src");
  rules::check_tag(tag);
  SEQPAR_ARG_CHECK(data != nullptr && lease != nullptr,
                   "irecv_borrow: data and lease must not be null");
  throw_if_aborted();
  rules::account_recv(stats_, bytes, src == rank_);
  *data = nullptr;
  auto op = new_op(bytes, src, rank_, tag);
  // The lease: dropping it ends the borrow (completes the lending send) or, before a match,
  // tells the matching send that nobody will read it.
  *lease = std::shared_ptr<void>(op.get(), [world = world_, op](void*) {
    std::lock_guard<std::mutex> lk(world->mu);
    op->lease_dropped = true;
    if (op->lender) {
      if (op->lender->state == State::kLent) op->lender->state = State::kDone;
      op->lender.reset();
      world->notify_all_locked();
    }
  });
  op->recv_buf = buf;
  op->borrow = true;
  op->borrowed = data;
  return post(std::move(op));
}

Request ThreadCommunicator::irecv(void* buf, size_t bytes, int src, int tag) {
  rules::check_irecv(buf, bytes, src, tag, size());
  throw_if_aborted();
  rules::account_recv(stats_, bytes, src == rank_);
  auto op = new_op(bytes, src, rank_, tag);
  op->recv_buf = buf;
  return post(std::move(op));
}

void ThreadCommunicator::rendezvous(Clock::time_point deadline, const CollSlot* publish) {
  ThreadGroup& g = *group_;
  std::unique_lock<std::mutex> lk(world_->mu);
  // A phase barrier (publish == nullptr) leaves neither on an abort nor on the deadline: every
  // member passed the opening rendezvous and may still be copying out of this rank's buffers,
  // which must outlive the copies. The work between phases cannot fail or block, so every member
  // arrives.
  const bool opening = publish != nullptr;
  if (opening && world_->aborted.load()) throw CommError(world_->failure_locked());
  if (opening) g.slots[rank_] = *publish;
  const uint64_t gen = g.generation;
  const uint64_t my_arrivals = ++g.arrivals[rank_];
  if (++g.arrived == g.size()) {
    g.arrived = 0;
    g.mismatch = publish != nullptr ? check_slots(g) : std::string();
    ++g.generation;
    world_->notify_all_locked();
  } else {
    world_->spin_until(lk, [&] { return g.generation != gen || world_->aborted.load(); });
    if (!opening) {
      world_->cv.wait(lk, [&] { return g.generation != gen; });
      return;
    }
    while (g.generation == gen) {
      if (world_->aborted.load()) throw CommError(world_->failure_locked());
      if (world_->cv.wait_until(lk, deadline) == std::cv_status::timeout && g.generation == gen &&
          !world_->aborted.load()) {
        std::string late;
        for (int i = 0; i < g.size(); ++i) {
          if (g.arrivals[i] < my_arrivals) late += detail::concat(late.empty() ? "" : ", ", i);
        }
        std::string msg =
            rules::timeout_message(timeout(), who(),
                                   detail::concat(op_kind_name(g.slots[rank_].kind), " (rank(s) ",
                                                  late, " of ", g.size(), " not arrived)"));
        world_->abort_locked(world_rank(), msg);
        throw CommTimeout(msg);
      }
    }
  }
  if (publish != nullptr && !g.mismatch.empty()) throw CommError(g.mismatch);
}

template <typename Work>
void ThreadCommunicator::collective(const CollSlot& slot, int phases, Work&& work) {
  throw_if_aborted();
  rules::WaitClock clock(&stats_);
  const auto deadline = Clock::now() + timeout();
  rendezvous(deadline, &slot);
  for (int p = 0; p < phases; ++p) {
    work(p);
    rendezvous(deadline, nullptr);
  }
}

void ThreadCommunicator::all_gather(const void* send, size_t bytes, void* recv) {
  rules::CollectiveTrace trace_op(OpKind::kAllGather, stats_);
  rules::check_all_gather(send, bytes, recv, rank_, size());
  rules::account_all_gather(stats_, bytes, size());
  CollSlot slot;
  slot.kind = OpKind::kAllGather;
  slot.send = send;
  slot.bytes = bytes;
  collective(slot, 1, [&](int) {
    auto* out = static_cast<char*>(recv);
    for (int i = 0; i < size(); ++i) {
      const void* src = group_->slots[i].send;
      char* dst = out + static_cast<size_t>(i) * bytes;
      if (bytes > 0 && src != dst) std::memcpy(dst, src, bytes);
    }
  });
}

void ThreadCommunicator::all_gatherv(const void* send, void* recv, std::span<const size_t> counts) {
  rules::CollectiveTrace trace_op(OpKind::kAllGatherV, stats_);
  rules::check_all_gatherv(send, recv, counts, rank_, size());
  rules::account_all_gatherv(stats_, counts, rank_);
  CollSlot slot;
  slot.kind = OpKind::kAllGatherV;
  slot.send = send;
  slot.counts = counts;
  collective(slot, 1, [&](int) {
    auto* out = static_cast<char*>(recv);
    size_t offset = 0;
    for (int i = 0; i < size(); ++i) {
      const void* src = group_->slots[i].send;
      if (counts[i] > 0 && src != out + offset) std::memcpy(out + offset, src, counts[i]);
      offset += counts[i];
    }
  });
}

void ThreadCommunicator::all_to_all(const void* send, void* recv, size_t bytes_per_rank) {
  rules::CollectiveTrace trace_op(OpKind::kAllToAll, stats_);
  rules::check_all_to_all(send, recv, bytes_per_rank, size());
  rules::account_all_to_all(stats_, bytes_per_rank, size());
  CollSlot slot;
  slot.kind = OpKind::kAllToAll;
  slot.send = send;
  slot.bytes = bytes_per_rank;
  collective(slot, 1, [&](int) {
    if (bytes_per_rank == 0) return;
    auto* out = static_cast<char*>(recv);
    for (int i = 0; i < size(); ++i) {
      const auto* src = static_cast<const char*>(group_->slots[i].send);
      std::memcpy(out + static_cast<size_t>(i) * bytes_per_rank,
                  src + static_cast<size_t>(rank_) * bytes_per_rank, bytes_per_rank);
    }
  });
}

void ThreadCommunicator::all_to_allv(const void* send, std::span<const size_t> send_counts,
                                     void* recv, std::span<const size_t> recv_counts) {
  rules::CollectiveTrace trace_op(OpKind::kAllToAllV, stats_);
  rules::check_all_to_allv(send, send_counts, recv, recv_counts, size());
  rules::account_all_to_allv(stats_, send_counts, recv_counts, rank_);
  CollSlot slot;
  slot.kind = OpKind::kAllToAllV;
  slot.send = send;
  slot.counts = send_counts;
  slot.recv_counts = recv_counts;
  collective(slot, 1, [&](int) {
    auto* out = static_cast<char*>(recv);
    size_t offset = 0;
    for (int i = 0; i < size(); ++i) {
      const CollSlot& peer = group_->slots[i];
      size_t src_offset = 0;  // where peer i packed its block for this rank
      for (int j = 0; j < rank_; ++j) src_offset += peer.counts[j];
      if (recv_counts[i] > 0) {
        std::memcpy(out + offset, static_cast<const char*>(peer.send) + src_offset, recv_counts[i]);
      }
      offset += recv_counts[i];
    }
  });
}

void ThreadCommunicator::all_reduce(void* buf, size_t n, Elem elem, ReduceOp op) {
  rules::CollectiveTrace trace_op(OpKind::kAllReduce, stats_);
  rules::check_buffer(buf, n, "all_reduce: buf");
  const int p = size();
  rules::account_all_reduce(stats_, n * rules::elem_size(elem), p);
  CollSlot slot;
  slot.kind = OpKind::kAllReduce;
  slot.recv = buf;
  slot.n = n;
  slot.elem = elem;
  slot.op = op;
  auto seg = [&](int r) { return n * static_cast<size_t>(r) / static_cast<size_t>(p); };
  const size_t esize = rules::elem_size(elem);
  // Step 0: rank r reduces segment r of every rank's buffer, in rank order, into its own buffer
  // (segments are disjoint, so nobody reads what another rank writes).
  // Step 1: rank r copies every other segment s from rank s's buffer, which now holds the result.
  collective(slot, p > 1 ? 2 : 0, [&](int phase) {
    const size_t begin = seg(rank_), end = seg(rank_ + 1);
    if (phase == 0) {
      if (begin == end) return;
      auto reduce = [&](auto* typed) {
        using T = std::remove_pointer_t<decltype(typed)>;
        std::vector<const T*> in(static_cast<size_t>(p));
        for (int i = 0; i < p; ++i) in[i] = static_cast<const T*>(group_->slots[i].recv);
        reduce_segment<T>(in, typed, begin, end, op);
      };
      if (elem == Elem::kF32) reduce(static_cast<float*>(buf));
      if (elem == Elem::kF64) reduce(static_cast<double*>(buf));
      if (elem == Elem::kI64) reduce(static_cast<int64_t*>(buf));
    } else {
      for (int s = 0; s < p; ++s) {
        if (s == rank_ || seg(s) == seg(s + 1)) continue;
        std::memcpy(static_cast<char*>(buf) + seg(s) * esize,
                    static_cast<const char*>(group_->slots[s].recv) + seg(s) * esize,
                    (seg(s + 1) - seg(s)) * esize);
      }
    }
  });
}

void ThreadCommunicator::broadcast(void* buf, size_t bytes, int root) {
  rules::CollectiveTrace trace_op(OpKind::kBroadcast, stats_);
  rules::check_broadcast(buf, bytes, root, size());
  rules::account_broadcast(stats_, bytes, root, rank_, size());
  CollSlot slot;
  slot.kind = OpKind::kBroadcast;
  slot.send = buf;
  slot.bytes = bytes;
  slot.root = root;
  collective(slot, 1, [&](int) {
    if (rank_ != root && bytes > 0) std::memcpy(buf, group_->slots[root].send, bytes);
  });
}

void ThreadCommunicator::barrier() {
  rules::CollectiveTrace trace_op(OpKind::kBarrier, stats_);
  rules::account_barrier(stats_);
  CollSlot slot;
  slot.kind = OpKind::kBarrier;
  collective(slot, 0, [](int) {});
}

std::unique_ptr<Communicator> ThreadCommunicator::split(int color, int key) {
  // Not counted in CommStats: setting up groups is not traffic of the algorithms.
  CollSlot slot;
  slot.kind = OpKind::kSplit;
  slot.color = color;
  slot.key = key;
  const uint64_t split_number = splits_++;
  std::shared_ptr<ThreadGroup> group;
  int new_rank = -1;
  collective(slot, 1, [&](int) {
    if (color < 0) return;
    // Members of my color ordered by (key, old rank).
    std::vector<std::pair<int, int>> members;
    for (int i = 0; i < size(); ++i) {
      const CollSlot& s = group_->slots[i];
      if (s.color == color) members.emplace_back(s.key, i);
    }
    std::sort(members.begin(), members.end());
    for (size_t m = 0; m < members.size(); ++m) {
      if (members[m].second == rank_) new_rank = static_cast<int>(m);
    }
    std::lock_guard<std::mutex> lk(world_->mu);
    const auto split_key = ThreadWorldState::SplitKey{group_->id, split_number, color};
    auto it = world_->pending_splits.find(split_key);
    if (it == world_->pending_splits.end()) {
      auto g = std::make_shared<ThreadGroup>();
      g->id = world_->next_group_id++;
      for (const auto& m : members) g->world_ranks.push_back(group_->world_ranks[m.second]);
      g->slots.resize(members.size());
      g->arrivals.resize(members.size());
      it = world_->pending_splits.emplace(split_key, std::make_pair(g, int(members.size()))).first;
    }
    group = it->second.first;
    if (--it->second.second == 0) world_->pending_splits.erase(it);
  });
  if (color < 0) return nullptr;
  return std::make_unique<ThreadCommunicator>(world_, std::move(group), new_rank, timeout());
}

std::string exception_message(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ThreadWorld

ThreadWorld::ThreadWorld(int size, std::chrono::milliseconds timeout) {
  SEQPAR_ARG_CHECK(size >= 1 && size <= limits::kMaxThreads, "ThreadWorld: size ", size,
                   " is invalid: valid 1 to ", limits::max_text(limits::kMaxThreads), " ranks");
  SEQPAR_ARG_CHECK(timeout.count() > 0, "ThreadWorld: timeout must be positive");
  state_ = std::make_shared<ThreadWorldState>(size, timeout);
}

ThreadWorld::~ThreadWorld() = default;

int ThreadWorld::size() const { return state_->size; }

std::unique_ptr<Communicator> ThreadWorld::communicator(int rank) {
  SEQPAR_ARG_CHECK(rank >= 0 && rank < state_->size, "ThreadWorld::communicator: rank ", rank,
                   " is out of range 0..", state_->size - 1);
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    SEQPAR_CHECK(!state_->handed_out[rank], "communicator(", rank, ") was already handed out");
    state_->handed_out[rank] = true;
  }
  return std::make_unique<ThreadCommunicator>(state_, state_->world_group, rank, state_->timeout);
}

std::function<void(int rank)>& ThreadWorld::thread_start_hook() {
  static std::function<void(int rank)> hook;
  return hook;
}

void ThreadWorld::run(int size, const std::function<void(Communicator&)>& fn,
                      std::chrono::milliseconds timeout) {
  run(size, fn, timeout, nullptr);
}

void ThreadWorld::run(int size, const std::function<void(Communicator&)>& fn,
                      std::chrono::milliseconds timeout, const std::function<bool()>& interrupted) {
  ThreadWorld world(size, timeout);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r) comms.push_back(world.communicator(r));

  std::mutex mu;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<int> order;  // ranks in the order their exceptions were caught
  int running = size;      // rank threads not yet done (under mu)
  std::condition_variable done;
  struct Done {  // counts the rank out however its thread ends
    std::mutex& mu;
    int& running;
    std::condition_variable& done;
    ~Done() {
      std::lock_guard<std::mutex> lk(mu);
      --running;
      done.notify_all();
    }
  };
  auto body = [&](int r) {
    Done counted{mu, running, done};
    char name[16];  // as `top -H` and debuggers show the thread (15 characters at most)
    std::snprintf(name, sizeof(name), "seqpar rank %d", r);
    pthread_setname_np(pthread_self(), name);
    // Waiting ranks help only while they spin (not past the CPUs): off the board otherwise.
    std::optional<OnTeamBoard> member;
    if (world.state_->spin_ns > 0) member.emplace(world.state_->board, r);
    try {
      fn(*comms[r]);
    } catch (abi::__forced_unwind&) {
      // The thread is being ended (pthread_exit or cancellation: Python ends the threads that
      // still run seqpar when the interpreter exits). The unwinding must go on; the other ranks
      // learn that this one is gone.
      world.state_->abort(r, "the rank's thread was ended");
      throw;
    } catch (...) {
      std::exception_ptr e = std::current_exception();
      {
        std::lock_guard<std::mutex> lk(mu);
        errors[r] = e;
        order.push_back(r);
      }
      world.state_->abort(r, exception_message(e));
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(size));
  try {
    for (int r = 0; r < size; ++r) {
      if (thread_start_hook()) thread_start_hook()(r);
      threads.emplace_back(body, r);
    }
  } catch (const std::exception& e) {
    // Destroying a joinable std::thread terminates the process: fail the ranks already started
    // (their communication sees the abort), join them, then report.
    const int failed = static_cast<int>(threads.size());
    const std::string why =
        detail::concat("could not start the thread of rank ", failed, " of ", size, ": ", e.what());
    world.state_->abort(failed, why);
    for (auto& t : threads) t.join();
    throw Error(detail::concat("threads backend: ", why,
                               " (too many threads for this process or user; use fewer ranks "
                               "or threads, or the mpi backend)"));
  }
  bool stopped = false;
  if (interrupted) {
    std::unique_lock<std::mutex> lk(mu);
    while (running > 0) {
      if (done.wait_for(lk, std::chrono::milliseconds(100), [&] { return running == 0; })) break;
      lk.unlock();
      if (!stopped && interrupted()) {
        stopped = true;
        world.state_->abort(-1, "interrupted");
      }
      lk.lock();
    }
  }
  for (auto& t : threads) t.join();
  comms.clear();
  if (stopped) throw Interrupted("interrupted: the ranks were stopped");

  if (order.empty()) return;
  // The rank that aborted the world first holds the original error (a rank that timed out
  // aborts inside its wait, before its exception reaches this function); the others only
  // report that abort.
  int culprit = order.front();
  {
    std::lock_guard<std::mutex> lk(world.state_->mu);
    const int r = world.state_->abort_rank;
    if (r >= 0 && errors[r]) culprit = r;
  }
  std::rethrow_exception(errors[culprit]);
}

}  // namespace seqpar
