// The rules every communicator backend applies to an op, written once: argument checks, the
// logical byte accounting of CommStats (docs/communication.md), deadlines and the wording of
// timeout errors. Private to src/comm/.
// Thread-safety: pure functions; the CommStats passed in belongs to the calling rank.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "seqpar/comm/communicator.h"

namespace seqpar::comm_rules {

using Clock = std::chrono::steady_clock;

// Argument checks (throw InvalidArgument naming the parameter).
void check_peer(int peer, int size, const char* what);  // 0 <= peer < size
void check_tag(int tag);                                // tag >= 0
void check_counts(std::span<const size_t> counts, int size, const char* what);
void check_buffer(const void* p, size_t bytes, const char* what);  // non-null unless bytes == 0
// all_gather(v): send is either this rank's block of recv (in place, recv + offset) or a buffer
// that does not overlap recv[0, total).
void check_gather_buffers(const void* send, size_t bytes, const void* recv, size_t offset,
                          size_t total, const char* what);
// The checks of each op's arguments, the same on every backend, before the op starts.
void check_isend(const void* buf, size_t bytes, int dst, int tag, int size);
void check_irecv(const void* buf, size_t bytes, int src, int tag, int size);
void check_all_gather(const void* send, size_t bytes, const void* recv, int rank, int size);
void check_all_gatherv(const void* send, const void* recv, std::span<const size_t> counts,
                       int rank, int size);
void check_all_to_all(const void* send, const void* recv, size_t bytes_per_rank, int size);
void check_all_to_allv(const void* send, std::span<const size_t> send_counts, const void* recv,
                       std::span<const size_t> recv_counts, int size);
void check_broadcast(const void* buf, size_t bytes, int root, int size);
size_t elem_size(Communicator::Elem elem);
std::string_view elem_name(Communicator::Elem elem);
std::string_view reduce_name(ReduceOp op);

// What a rank passes to a collective that every rank of the group must pass alike.
struct CollectiveCall {
  OpKind kind = OpKind::kBarrier;
  uint64_t size = 0;  // bytes (all_gather, all_to_all per rank, broadcast), elements (all_reduce)
  Communicator::Elem elem = Communicator::Elem::kF32;  // all_reduce
  ReduceOp op = ReduceOp::kSum;                        // all_reduce
  int root = 0;                                        // broadcast
};
// Compares every rank's call with rank 0's: "" when they agree, else the message of the
// CommError every rank reports ("collective mismatch: rank 0 calls all_gather, rank 2 calls
// barrier", "all_gather size mismatch: ..."). The counts of all_gatherv and all_to_allv are the
// backends' to compare.
std::string collective_mismatch(std::span<const CollectiveCall> calls);
// "[1, 2, 3]"
std::string format_counts(std::span<const size_t> counts);

// Byte accounting: the logical bytes of each op, self-transfers excluded, one op each call.
//   isend: sent += bytes                      irecv: recv += bytes
//   all_gather(v): sent = own·(N-1),          recv = sum of the others' blocks
//   all_to_all(v): sent = sum_{j!=me} send[j], recv = sum_{i!=me} recv[i]
//   all_reduce of n bytes: sent = recv = n·(N-1)
//   broadcast: root sent = bytes·(N-1), every other rank recv = bytes
//   barrier: 0 bytes
void account_send(CommStats& s, size_t bytes, bool self);
void account_recv(CommStats& s, size_t bytes, bool self);
void account_all_gather(CommStats& s, size_t bytes, int size);
void account_all_gatherv(CommStats& s, std::span<const size_t> counts, int rank);
void account_all_to_all(CommStats& s, size_t bytes_per_rank, int size);
void account_all_to_allv(CommStats& s, std::span<const size_t> send_counts,
                         std::span<const size_t> recv_counts, int rank);
void account_all_reduce(CommStats& s, size_t bytes, int size);
void account_broadcast(CommStats& s, size_t bytes, int root, int rank, int size);
void account_barrier(CommStats& s);

// "60", "0.2", "1.5": a timeout in seconds as written in messages.
std::string format_seconds(std::chrono::milliseconds t);
// "rank 1", or "rank 1 (world rank 3)" on a communicator that is not the world.
std::string rank_label(int rank, int world_rank, bool is_world);
// "timeout after 60 s: <who> waiting for <what>; set SEQPAR_TIMEOUT_S to wait longer"
std::string timeout_message(std::chrono::milliseconds t, const std::string& who,
                            const std::string& what);
// "rank R failed: <message>", the error every other rank reports after rank R's failure.
std::string peer_failed_message(int world_rank, const std::string& message);

// Adds the seconds since `start` to stats.wait_seconds when it goes out of scope.
class WaitClock {
 public:
  explicit WaitClock(CommStats* stats) : stats_(stats), start_(Clock::now()) {}
  ~WaitClock() {
    if (stats_ != nullptr) {
      stats_->wait_seconds += std::chrono::duration<double>(Clock::now() - start_).count();
    }
  }
  WaitClock(const WaitClock&) = delete;
  WaitClock& operator=(const WaitClock&) = delete;

 private:
  CommStats* stats_;
  Clock::time_point start_;
};

// Lets a Request find the CommStats of its communicator while the communicator lives: the
// communicator nulls `stats` in its destructor, so a request that outlives it records nothing.
struct StatsLink {
  CommStats* stats = nullptr;
};

}  // namespace seqpar::comm_rules
