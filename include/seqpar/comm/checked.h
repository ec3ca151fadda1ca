// CheckedCommunicator: a forwarding wrapper around any Communicator (like leveldb's EnvWrapper or
// c10d's ProcessGroupWrapper) that
//   - before each collective all-gathers every rank's (op, sizes) over the inner communicator and
//     throws CommError on every rank naming the first mismatch, e.g.
//     "all_gather size mismatch: rank 0 sends 4096 bytes, rank 2 sends 2048"; the collective is
//     then not run, the group stays usable;
//   - injects faults for tests: make this rank throw (after announcing the failure with abort()),
//     sleep, or silently skip ("drop") its k-th op.
// Cost: one extra 32-byte all_gather per collective (plus one of 16·size() bytes for
// all_to_allv, and one of 8·size() bytes when all_gatherv counts differ). That traffic is counted
// in the inner communicator's CommStats; this wrapper's stats() hold only the forwarded ops, so
// they equal what the unwrapped communicator would count. Point-to-point ops are not checked.
// Thread-safety: like every Communicator, used by its rank's thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "seqpar/comm/communicator.h"

namespace seqpar {

class CheckedCommunicator final : public Communicator {
 public:
  enum class FaultKind { kThrow, kDelay, kDrop };
  struct Fault {
    int rank = 0;    // the rank (of this communicator) that misbehaves
    int64_t op = 1;  // its op number, counting from 1: every isend, irecv, collective, split
    FaultKind kind = FaultKind::kThrow;
    std::chrono::milliseconds delay{0};  // kDelay
  };

  explicit CheckedCommunicator(std::unique_ptr<Communicator> inner);  // owns inner
  explicit CheckedCommunicator(Communicator& inner);                  // borrows inner
  ~CheckedCommunicator() override;

  Communicator& inner() { return *inner_; }

  // Faults may be registered on every rank alike; each applies only on its `rank`.
  void inject(const Fault& fault) { faults_.push_back(fault); }
  void inject_throw(int rank, int64_t op) { inject({rank, op, FaultKind::kThrow, {}}); }
  void inject_delay(int rank, int64_t op, std::chrono::milliseconds delay) {
    inject({rank, op, FaultKind::kDelay, delay});
  }
  void inject_drop(int rank, int64_t op) { inject({rank, op, FaultKind::kDrop, {}}); }
  int64_t ops_seen() const { return ops_seen_; }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }

  Request isend(const void* buf, size_t bytes, int dst, int tag) override;
  Request irecv(void* buf, size_t bytes, int src, int tag) override;
  void all_gather(const void* send, size_t bytes, void* recv) override;
  void all_gatherv(const void* send, void* recv, std::span<const size_t> counts) override;
  void all_to_all(const void* send, void* recv, size_t bytes_per_rank) override;
  void all_to_allv(const void* send, std::span<const size_t> send_counts, void* recv,
                   std::span<const size_t> recv_counts) override;
  void all_reduce(void* buf, size_t n, Elem elem, ReduceOp op) override;
  using Communicator::all_reduce;
  void broadcast(void* buf, size_t bytes, int root) override;
  void barrier() override;
  // The sub-communicator is checked too (faults are not inherited).
  std::unique_ptr<Communicator> split(int color, int key) override;
  void abort(const std::string& message) override { inner_->abort(message); }

 private:
  struct Desc;
  struct StatsLink;

  // Counts the op, applies this rank's faults; false = drop it.
  bool begin_op(std::string_view name);
  // All-gathers this rank's descriptor and throws CommError on every rank if the ops or their
  // uniform sizes differ. Returns whether every rank has the same `a` field (the all_gatherv
  // counts hash, whose mismatch the caller reports).
  bool check(const Desc& mine);
  template <typename Op>
  void forward(Op&& op);  // runs op on inner_, adds inner_'s stats delta to stats_

  std::unique_ptr<Communicator> owned_;
  Communicator* inner_;
  std::vector<Fault> faults_;
  int64_t ops_seen_ = 0;
  std::shared_ptr<StatsLink> link_;
};

}  // namespace seqpar
