// CheckedCommunicator: cross-rank validation of collectives and fault injection.
#include "seqpar/comm/checked.h"

#include <thread>

#include "op_rules.h"

namespace seqpar {

namespace rules = comm_rules;
using detail::concat;

struct CheckedCommunicator::StatsLink : rules::StatsLink {};

// What a rank is about to do, as all ranks must agree on it. 32 bytes.
struct CheckedCommunicator::Desc {
  int32_t kind = 0;  // OpKind
  int32_t aux = 0;   // broadcast: root; all_reduce: elem * 2 + op
  uint64_t a = 0;    // bytes (all_gather, all_to_all, broadcast), n (all_reduce), counts hash
  uint64_t b = 0;    // reserved
  uint64_t c = 0;    // reserved
};

namespace {

uint64_t hash_counts(std::span<const size_t> counts) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the 8-byte values
  for (size_t c : counts) {
    for (int i = 0; i < 8; ++i) {
      h ^= (static_cast<uint64_t>(c) >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h;
}

Communicator::Elem elem_of(int32_t aux) { return static_cast<Communicator::Elem>(aux / 2); }
ReduceOp op_of(int32_t aux) { return static_cast<ReduceOp>(aux % 2); }

class CheckedRequest final : public RequestImpl {
 public:
  CheckedRequest(Request inner, std::shared_ptr<rules::StatsLink> link)
      : inner_(std::move(inner)), link_(std::move(link)) {}
  void wait() override {
    rules::WaitClock clock(link_->stats);
    inner_.wait();
  }
  bool test() override { return inner_.test(); }

 private:
  Request inner_;
  std::shared_ptr<rules::StatsLink> link_;
};

}  // namespace

CheckedCommunicator::CheckedCommunicator(std::unique_ptr<Communicator> inner)
    : CheckedCommunicator(*inner) {
  owned_ = std::move(inner);
}

CheckedCommunicator::CheckedCommunicator(Communicator& inner)
    : inner_(&inner), link_(std::make_shared<StatsLink>()) {
  link_->stats = &stats_;
  timeout_ = inner.timeout();
}

CheckedCommunicator::~CheckedCommunicator() { link_->stats = nullptr; }

bool CheckedCommunicator::begin_op(std::string_view name) {
  inner_->set_timeout(timeout_);
  const int64_t n = ++ops_seen_;
  bool run = true;
  for (const Fault& f : faults_) {
    if (f.rank != rank() || f.op != n) continue;
    switch (f.kind) {
      case FaultKind::kThrow: {
        std::string msg =
            concat("injected fault: rank ", rank(), " fails at op ", n, " (", name, ")");
        inner_->abort(msg);
        throw CommError(msg);
      }
      case FaultKind::kDelay:
        std::this_thread::sleep_for(f.delay);
        break;
      case FaultKind::kDrop:
        run = false;
        break;
    }
  }
  return run;
}

bool CheckedCommunicator::check(const Desc& mine) {
  const int n = size();
  std::vector<Desc> all(static_cast<size_t>(n));
  inner_->all_gather(&mine, sizeof(Desc), all.data());
  std::vector<rules::CollectiveCall> calls;
  for (const Desc& d : all)
    calls.push_back({static_cast<OpKind>(d.kind), d.a, elem_of(d.aux), op_of(d.aux), d.aux});
  if (std::string m = rules::collective_mismatch(calls); !m.empty()) throw CommError(m);
  bool same_a = true;
  for (const Desc& d : all) same_a = same_a && d.a == all[0].a;
  return same_a;
}

template <typename Op>
void CheckedCommunicator::forward(Op&& op) {
  const CommStats before = inner_->stats();
  rules::WaitClock clock(&stats_);
  op();
  const CommStats& after = inner_->stats();
  for (size_t k = 0; k < before.ops.size(); ++k) {
    stats_.bytes_sent[k] += after.bytes_sent[k] - before.bytes_sent[k];
    stats_.bytes_recv[k] += after.bytes_recv[k] - before.bytes_recv[k];
    stats_.ops[k] += after.ops[k] - before.ops[k];
  }
}

Request CheckedCommunicator::isend(const void* buf, size_t bytes, int dst, int tag) {
  if (!begin_op("isend")) return Request();
  Request r;
  const CommStats before = inner_->stats();
  r = inner_->isend(buf, bytes, dst, tag);
  const CommStats& after = inner_->stats();
  for (size_t k = 0; k < before.ops.size(); ++k) {
    stats_.bytes_sent[k] += after.bytes_sent[k] - before.bytes_sent[k];
    stats_.ops[k] += after.ops[k] - before.ops[k];
  }
  return Request(std::make_shared<CheckedRequest>(std::move(r), link_));
}

Request CheckedCommunicator::irecv(void* buf, size_t bytes, int src, int tag) {
  if (!begin_op("irecv")) return Request();
  Request r;
  const CommStats before = inner_->stats();
  r = inner_->irecv(buf, bytes, src, tag);
  const CommStats& after = inner_->stats();
  for (size_t k = 0; k < before.ops.size(); ++k) {
    stats_.bytes_recv[k] += after.bytes_recv[k] - before.bytes_recv[k];
    stats_.ops[k] += after.ops[k] - before.ops[k];
  }
  return Request(std::make_shared<CheckedRequest>(std::move(r), link_));
}

void CheckedCommunicator::all_gather(const void* send, size_t bytes, void* recv) {
  if (!begin_op(op_kind_name(OpKind::kAllGather))) return;
  Desc d;
  d.kind = static_cast<int32_t>(OpKind::kAllGather);
  d.a = bytes;
  check(d);
  forward([&] { inner_->all_gather(send, bytes, recv); });
}

void CheckedCommunicator::all_gatherv(const void* send, void* recv,
                                      std::span<const size_t> counts) {
  if (!begin_op(op_kind_name(OpKind::kAllGatherV))) return;
  rules::check_counts(counts, size(), "all_gatherv: counts");
  Desc d;
  d.kind = static_cast<int32_t>(OpKind::kAllGatherV);
  d.a = hash_counts(counts);
  if (!check(d)) {
    // Counts differ somewhere: every rank gathers all counts to name the first difference.
    const size_t n = counts.size();
    std::vector<uint64_t> mine(counts.begin(), counts.end()), all(n * n);
    inner_->all_gather(mine.data(), n * sizeof(uint64_t), all.data());
    for (size_t i = 1; i < n; ++i) {
      if (!std::equal(all.begin(), all.begin() + n, all.begin() + i * n)) {
        throw CommError(concat("all_gatherv counts mismatch: rank 0 has counts ",
                               rules::format_counts({all.data(), n}), ", rank ", i, " has ",
                               rules::format_counts({all.data() + i * n, n})));
      }
    }
    throw CommError("all_gatherv counts mismatch");  // hash collision of equal counts: unreachable
  }
  forward([&] { inner_->all_gatherv(send, recv, counts); });
}

void CheckedCommunicator::all_to_all(const void* send, void* recv, size_t bytes_per_rank) {
  if (!begin_op(op_kind_name(OpKind::kAllToAll))) return;
  Desc d;
  d.kind = static_cast<int32_t>(OpKind::kAllToAll);
  d.a = bytes_per_rank;
  check(d);
  forward([&] { inner_->all_to_all(send, recv, bytes_per_rank); });
}

void CheckedCommunicator::all_to_allv(const void* send, std::span<const size_t> send_counts,
                                      void* recv, std::span<const size_t> recv_counts) {
  if (!begin_op(op_kind_name(OpKind::kAllToAllV))) return;
  rules::check_counts(send_counts, size(), "all_to_allv: send_counts");
  rules::check_counts(recv_counts, size(), "all_to_allv: recv_counts");
  Desc d;
  d.kind = static_cast<int32_t>(OpKind::kAllToAllV);
  check(d);
  // Every rank sees the whole (sender, receiver) matrix, so all name the same first mismatch.
  const size_t n = send_counts.size();
  std::vector<uint64_t> mine(2 * n), all(2 * n * n);
  std::copy(send_counts.begin(), send_counts.end(), mine.begin());
  std::copy(recv_counts.begin(), recv_counts.end(), mine.begin() + n);
  inner_->all_gather(mine.data(), 2 * n * sizeof(uint64_t), all.data());
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const uint64_t sent = all[i * 2 * n + j], expected = all[j * 2 * n + n + i];
      if (sent != expected) {
        throw CommError(concat("all_to_allv count mismatch: rank ", i, " sends ", sent,
                               " bytes to rank ", j, ", rank ", j, " expects ", expected,
                               " from rank ", i));
      }
    }
  }
  forward([&] { inner_->all_to_allv(send, send_counts, recv, recv_counts); });
}

void CheckedCommunicator::all_reduce(void* buf, size_t n, Elem elem, ReduceOp op) {
  if (!begin_op(op_kind_name(OpKind::kAllReduce))) return;
  Desc d;
  d.kind = static_cast<int32_t>(OpKind::kAllReduce);
  d.aux = static_cast<int32_t>(elem) * 2 + static_cast<int32_t>(op);
  d.a = n;
  check(d);
  forward([&] { inner_->all_reduce(buf, n, elem, op); });
}

void CheckedCommunicator::broadcast(void* buf, size_t bytes, int root) {
  if (!begin_op(op_kind_name(OpKind::kBroadcast))) return;
  Desc d;
  d.kind = static_cast<int32_t>(OpKind::kBroadcast);
  d.aux = root;
  d.a = bytes;
  check(d);
  forward([&] { inner_->broadcast(buf, bytes, root); });
}

void CheckedCommunicator::barrier() {
  if (!begin_op(op_kind_name(OpKind::kBarrier))) return;
  Desc d;
  d.kind = static_cast<int32_t>(OpKind::kBarrier);
  check(d);
  forward([&] { inner_->barrier(); });
}

std::unique_ptr<Communicator> CheckedCommunicator::split(int color, int key) {
  if (!begin_op(op_kind_name(OpKind::kSplit))) return nullptr;
  Desc d;
  d.kind = static_cast<int32_t>(OpKind::kSplit);
  check(d);
  auto sub = inner_->split(color, key);
  if (!sub) return nullptr;
  return std::make_unique<CheckedCommunicator>(std::move(sub));
}

}  // namespace seqpar
