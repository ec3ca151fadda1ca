// Communicator: moves bytes between the ranks of a group. Backends: threads (in-process ranks,
// src/comm/threads/) and mpi (Open MPI, src/comm/mpi/).
//
// Semantics shared by every backend:
//   - isend/irecv never block; they return a Request. Request::wait() blocks until the op is done
//     or its deadline passes (Communicator::timeout(), default 60 s, env SEQPAR_TIMEOUT_S) and
//     rethrows the op's error as CommError. The buffer of an op must stay valid until its wait.
//     Messages between a pair of ranks with the same tag arrive in the order they were sent.
//   - Collectives are blocking, called by every rank of the group in the same order, and also
//     bounded by the deadline. Counts are in bytes unless the signature says elements.
//   - A failure on one rank (exception reported with abort(), timeout, dead peer) becomes a
//     CommError on every rank of the world at its next communication call; nothing waits forever.
//   - Every op adds to CommStats the bytes this rank sends and receives as the algorithm's
//     logical transfers (what a direct point-to-point implementation would move), independent of
//     how the backend realizes the collective. These are the numbers docs/algorithms.md predicts.
// Thread-safety: a Communicator is used by one thread (its rank's); distinct communicators of the
// same world may be used concurrently from their own threads.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "seqpar/core/dtype.h"
#include "seqpar/core/error.h"

namespace seqpar {

// The operations of a communicator, named as in its API: "send_recv" (isend and irecv),
// "all_gather", "all_to_all", "all_reduce", "broadcast", "barrier", "all_gatherv", "all_to_allv",
// "split". Traces, error messages and CommStats use these names. CommStats counts all_gatherv
// under kAllGather and all_to_allv under kAllToAll (one kind per pattern of transfers); split
// moves none of the caller's bytes and is not counted.
enum class OpKind {
  kSendRecv,
  kAllGather,
  kAllToAll,
  kAllReduce,
  kBroadcast,
  kBarrier,
  kAllGatherV,
  kAllToAllV,
  kSplit,
  kCount
};
std::string_view op_kind_name(OpKind kind);

struct CommStats {
  std::array<uint64_t, static_cast<size_t>(OpKind::kCount)> bytes_sent{};
  std::array<uint64_t, static_cast<size_t>(OpKind::kCount)> bytes_recv{};
  std::array<uint64_t, static_cast<size_t>(OpKind::kCount)> ops{};
  double wait_seconds = 0;  // time spent blocked in wait() and collectives

  uint64_t total_sent() const;
  uint64_t total_recv() const;
  void add(OpKind kind, uint64_t sent, uint64_t recv);
  CommStats& operator+=(const CommStats& o);
  void reset() { *this = CommStats{}; }
};

// The state of one non-blocking op. Backends derive from it.
class RequestImpl {
 public:
  virtual ~RequestImpl() = default;
  // Blocks until done or deadline; throws CommError on failure or timeout.
  virtual void wait() = 0;
  // True if done (rethrows a stored failure).
  virtual bool test() = 0;
};

// Handle to a non-blocking op. Default-constructed = already complete. wait() is idempotent.
class Request {
 public:
  Request() = default;
  explicit Request(std::shared_ptr<RequestImpl> impl) : impl_(std::move(impl)) {}
  void wait();
  bool test();
  bool valid() const { return impl_ != nullptr; }

 private:
  std::shared_ptr<RequestImpl> impl_;
};

// Waits for every request (all of them, even if one fails; the first failure is rethrown).
void wait_all(std::span<Request> requests);

enum class ReduceOp { kSum, kMax };

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "threads" or "mpi"

  // Point to point. tag >= 0.
  virtual Request isend(const void* buf, size_t bytes, int dst, int tag) = 0;
  virtual Request irecv(void* buf, size_t bytes, int src, int tag) = 0;

  // Zero-copy receive (a borrow). Matches sends like irecv and returns the receive's Request.
  // Where the backend shares memory with the peer (borrows() is true: threads), no byte moves:
  // once the request is done, *data points at the sender's buffer, which stays valid and
  // unchanged while *lease is held; resetting or destroying *lease ends the borrow and only then
  // completes the sender's isend. buf is unused there and may be nullptr. Elsewhere (mpi,
  // wrappers) this is irecv into buf, *data = buf and *lease is empty. CommStats count the
  // logical bytes of an irecv either way. A borrowed pointer may be forwarded (isend of *data):
  // that send keeps the bytes from the sender's point of view only while this lease is held.
  virtual Request irecv_borrow(void* buf, size_t bytes, int src, int tag, const void** data,
                               std::shared_ptr<void>* lease) {
    *data = buf;
    lease->reset();
    return irecv(buf, bytes, src, tag);
  }
  // True if irecv_borrow hands out the sender's buffer instead of copying.
  virtual bool borrows() const { return false; }

  // recv (size() * bytes) <- every rank's send (bytes), in rank order.
  virtual void all_gather(const void* send, size_t bytes, void* recv) = 0;
  // recv (sum counts) <- rank r's send (counts[r] bytes) at offset sum(counts[:r]).
  // counts has size() entries and is the same on every rank; send has counts[rank()] bytes.
  virtual void all_gatherv(const void* send, void* recv, std::span<const size_t> counts) = 0;
  // Block j of send (bytes each) goes to rank j; block i of recv comes from rank i.
  virtual void all_to_all(const void* send, void* recv, size_t bytes_per_rank) = 0;
  // send_counts[j] bytes to rank j (packed in rank order), recv_counts[i] bytes from rank i.
  virtual void all_to_allv(const void* send, std::span<const size_t> send_counts, void* recv,
                           std::span<const size_t> recv_counts) = 0;
  // In-place reduction over n elements of fp32, fp64 or int64 (dtype kF32 only among DType,
  // so the element type is given separately).
  enum class Elem { kF32, kF64, kI64 };
  virtual void all_reduce(void* buf, size_t n, Elem elem, ReduceOp op) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  virtual void barrier() = 0;

  // Collective: ranks with the same color form a new group, ordered by (key, old rank).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Reports a local failure to every rank of the world (best effort, does not throw): their
  // pending and future communication calls fail with CommError naming this rank and message.
  virtual void abort(const std::string& message) = 0;
  // After this rank's abort(): waits up to `grace` for an abort message from another rank and
  // returns its world rank and message ({-1, ""} when none came; the threads backend shares one
  // failure, so there is none to wait for).
  virtual std::pair<int, std::string> peer_abort(std::chrono::milliseconds grace) {
    (void)grace;
    return {-1, ""};
  }

  CommStats& stats() { return stats_; }
  const CommStats& stats() const { return stats_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

  // Convenience wrappers.
  template <typename T>
  void all_reduce(std::span<T> v, ReduceOp op);
  double all_reduce_max(double x);
  double all_reduce_sum(double x);

 protected:
  CommStats stats_;
  std::chrono::milliseconds timeout_ = default_timeout();

 public:
  // SEQPAR_TIMEOUT_S if set (seconds, may be fractional), else 60 s.
  static std::chrono::milliseconds default_timeout();
};

template <typename T>
void Communicator::all_reduce(std::span<T> v, ReduceOp op) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> ||
                std::is_same_v<T, int64_t>);
  Elem e = std::is_same_v<T, float> ? Elem::kF32 : std::is_same_v<T, double> ? Elem::kF64 : Elem::kI64;
  all_reduce(v.data(), v.size(), e, op);
}

}  // namespace seqpar
