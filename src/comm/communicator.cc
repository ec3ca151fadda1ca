// Backend-independent parts of the communicator: CommStats, Request, the default timeout and the
// shared op rules of op_rules.h.
#include "seqpar/comm/communicator.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "op_rules.h"
#include "seqpar/core/limits.h"

namespace seqpar {

std::string_view op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kSendRecv:
      return "send_recv";
    case OpKind::kAllGather:
      return "all_gather";
    case OpKind::kAllToAll:
      return "all_to_all";
    case OpKind::kAllReduce:
      return "all_reduce";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kAllGatherV:
      return "all_gatherv";
    case OpKind::kAllToAllV:
      return "all_to_allv";
    case OpKind::kSplit:
      return "split";
    case OpKind::kCount:
      break;
  }
  return "unknown";
}

uint64_t CommStats::total_sent() const {
  uint64_t t = 0;
  for (uint64_t b : bytes_sent) t += b;
  return t;
}

uint64_t CommStats::total_recv() const {
  uint64_t t = 0;
  for (uint64_t b : bytes_recv) t += b;
  return t;
}

void CommStats::add(OpKind kind, uint64_t sent, uint64_t recv) {
  const auto k = static_cast<size_t>(kind);
  SEQPAR_CHECK(k < bytes_sent.size(), "bad OpKind");
  bytes_sent[k] += sent;
  bytes_recv[k] += recv;
  ops[k] += 1;
}

CommStats& CommStats::operator+=(const CommStats& o) {
  for (size_t k = 0; k < bytes_sent.size(); ++k) {
    bytes_sent[k] += o.bytes_sent[k];
    bytes_recv[k] += o.bytes_recv[k];
    ops[k] += o.ops[k];
  }
  wait_seconds += o.wait_seconds;
  return *this;
}

void Request::wait() {
  if (!impl_) return;
  impl_->wait();
  impl_.reset();  // done: later waits return at once
}

bool Request::test() {
  if (!impl_) return true;
  if (!impl_->test()) return false;
  impl_.reset();
  return true;
}

void wait_all(std::span<Request> requests) {
  std::exception_ptr first;
  for (Request& r : requests) {
    try {
      r.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

std::chrono::milliseconds Communicator::default_timeout() {
  constexpr std::chrono::milliseconds kDefault{60'000};
  const char* env = std::getenv("SEQPAR_TIMEOUT_S");
  if (env == nullptr || *env == '\0') return kDefault;
  errno = 0;
  char* end = nullptr;
  const double seconds = std::strtod(env, &end);
  const bool parsed = end != env && *end == '\0' && errno == 0;
  // The same range as every timeout option (core/limits.h).
  SEQPAR_ARG_CHECK(parsed && std::isfinite(seconds) && seconds >= limits::kMinTimeoutSeconds &&
                       seconds <= limits::kMaxTimeoutSeconds,
                   "SEQPAR_TIMEOUT_S='", std::string(env).substr(0, 32), "' is not valid: expected seconds from ",
                   limits::kMinTimeoutSeconds, " to ", limits::kMaxTimeoutSeconds, " (e.g. 60 or 0.5)");
  const auto ms = static_cast<int64_t>(std::llround(seconds * 1000.0));
  return std::chrono::milliseconds(ms < 1 ? 1 : ms);
}

double Communicator::all_reduce_max(double x) {
  all_reduce(&x, 1, Elem::kF64, ReduceOp::kMax);
  return x;
}

double Communicator::all_reduce_sum(double x) {
  all_reduce(&x, 1, Elem::kF64, ReduceOp::kSum);
  return x;
}

namespace comm_rules {

void check_peer(int peer, int size, const char* what) {
  SEQPAR_ARG_CHECK(peer >= 0 && peer < size, what, " ", peer, " is out of range: the group has ",
                   size, " ranks (0..", size - 1, ")");
}

void check_tag(int tag) { SEQPAR_ARG_CHECK(tag >= 0, "tag ", tag, " is invalid: tags are >= 0"); }

void check_counts(std::span<const size_t> counts, int size, const char* what) {
  SEQPAR_ARG_CHECK(counts.size() == static_cast<size_t>(size), what, " has ", counts.size(),
                   " entries, expected one per rank (", size, ")");
}

void check_buffer(const void* p, size_t bytes, const char* what) {
  SEQPAR_ARG_CHECK(p != nullptr || bytes == 0, what, " is null but ", bytes, " bytes are expected");
}

void check_gather_buffers(const void* send, size_t bytes, const void* recv, size_t offset,
                          size_t total, const char* what) {
  const auto* s = static_cast<const char*>(send);
  const auto* r = static_cast<const char*>(recv);
  if (bytes == 0 || total == 0 || s == r + offset) return;
  const bool overlap = s < r + total && r < s + bytes;
  SEQPAR_ARG_CHECK(!overlap, what, ": send overlaps recv; pass either a separate buffer or this ",
                   "rank's block of recv (recv + ", offset, ") to gather in place");
}

void check_isend(const void* buf, size_t bytes, int dst, int tag, int size) {
  check_peer(dst, size, "isend: dst");
  check_tag(tag);
  check_buffer(buf, bytes, "isend: buf");
}

void check_irecv(const void* buf, size_t bytes, int src, int tag, int size) {
  check_peer(src, size, "irecv: src");
  check_tag(tag);
  check_buffer(buf, bytes, "irecv: buf");
}

void check_all_gather(const void* send, size_t bytes, const void* recv, int rank, int size) {
  check_buffer(send, bytes, "all_gather: send");
  check_buffer(recv, bytes, "all_gather: recv");
  check_gather_buffers(send, bytes, recv, bytes * static_cast<size_t>(rank),
                       bytes * static_cast<size_t>(size), "all_gather");
}

void check_all_gatherv(const void* send, const void* recv, std::span<const size_t> counts,
                       int rank, int size) {
  check_counts(counts, size, "all_gatherv: counts");
  check_buffer(send, counts[rank], "all_gatherv: send");
  size_t offset = 0, total = 0;
  for (int i = 0; i < size; ++i) {
    if (i < rank) offset += counts[i];
    total += counts[i];
  }
  check_gather_buffers(send, counts[rank], recv, offset, total, "all_gatherv");
}

void check_all_to_all(const void* send, const void* recv, size_t bytes_per_rank, int size) {
  const size_t total = bytes_per_rank * static_cast<size_t>(size);
  check_buffer(send, total, "all_to_all: send");
  check_buffer(recv, total, "all_to_all: recv");
  SEQPAR_ARG_CHECK(send != recv || total == 0, "all_to_all: send and recv must not alias");
}

void check_all_to_allv(const void* send, std::span<const size_t> send_counts, const void* recv,
                       std::span<const size_t> recv_counts, int size) {
  check_counts(send_counts, size, "all_to_allv: send_counts");
  check_counts(recv_counts, size, "all_to_allv: recv_counts");
  size_t send_total = 0, recv_total = 0;
  for (int i = 0; i < size; ++i) {
    send_total += send_counts[i];
    recv_total += recv_counts[i];
  }
  check_buffer(send, send_total, "all_to_allv: send");
  check_buffer(recv, recv_total, "all_to_allv: recv");
  SEQPAR_ARG_CHECK(send != recv || send_total == 0 || recv_total == 0,
                   "all_to_allv: send and recv must not alias");
}

void check_broadcast(const void* buf, size_t bytes, int root, int size) {
  check_peer(root, size, "broadcast: root");
  check_buffer(buf, bytes, "broadcast: buf");
}

size_t elem_size(Communicator::Elem elem) { return elem == Communicator::Elem::kF32 ? 4 : 8; }

std::string_view elem_name(Communicator::Elem elem) {
  switch (elem) {
    case Communicator::Elem::kF32:
      return "f32";
    case Communicator::Elem::kF64:
      return "f64";
    case Communicator::Elem::kI64:
      return "i64";
  }
  return "?";
}

std::string_view reduce_name(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "max"; }

void account_send(CommStats& s, size_t bytes, bool self) {
  s.add(OpKind::kSendRecv, self ? 0 : bytes, 0);
}

void account_recv(CommStats& s, size_t bytes, bool self) {
  s.add(OpKind::kSendRecv, 0, self ? 0 : bytes);
}

void account_all_gather(CommStats& s, size_t bytes, int size) {
  const uint64_t others = static_cast<uint64_t>(size - 1);
  s.add(OpKind::kAllGather, bytes * others, bytes * others);
}

void account_all_gatherv(CommStats& s, std::span<const size_t> counts, int rank) {
  uint64_t recv = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (static_cast<int>(i) != rank) recv += counts[i];
  }
  s.add(OpKind::kAllGather, counts[rank] * static_cast<uint64_t>(counts.size() - 1), recv);
}

void account_all_to_all(CommStats& s, size_t bytes_per_rank, int size) {
  const uint64_t b = bytes_per_rank * static_cast<uint64_t>(size - 1);
  s.add(OpKind::kAllToAll, b, b);
}

void account_all_to_allv(CommStats& s, std::span<const size_t> send_counts,
                         std::span<const size_t> recv_counts, int rank) {
  uint64_t sent = 0, recv = 0;
  for (size_t j = 0; j < send_counts.size(); ++j) {
    if (static_cast<int>(j) == rank) continue;
    sent += send_counts[j];
    recv += recv_counts[j];
  }
  s.add(OpKind::kAllToAll, sent, recv);
}

void account_all_reduce(CommStats& s, size_t bytes, int size) {
  const uint64_t b = bytes * static_cast<uint64_t>(size - 1);
  s.add(OpKind::kAllReduce, b, b);
}

void account_broadcast(CommStats& s, size_t bytes, int root, int rank, int size) {
  if (rank == root) {
    s.add(OpKind::kBroadcast, bytes * static_cast<uint64_t>(size - 1), 0);
  } else {
    s.add(OpKind::kBroadcast, 0, bytes);
  }
}

void account_barrier(CommStats& s) { s.add(OpKind::kBarrier, 0, 0); }

std::string collective_mismatch(std::span<const CollectiveCall> calls) {
  using detail::concat;
  const CollectiveCall& a = calls[0];
  for (size_t i = 1; i < calls.size(); ++i) {
    if (calls[i].kind != a.kind) {
      return concat("collective mismatch: rank 0 calls ", op_kind_name(a.kind), ", rank ", i,
                    " calls ", op_kind_name(calls[i].kind));
    }
  }
  for (size_t i = 1; i < calls.size(); ++i) {
    const CollectiveCall& b = calls[i];
    switch (a.kind) {
      case OpKind::kAllGather:
        if (b.size != a.size) {
          return concat("all_gather size mismatch: rank 0 sends ", a.size, " bytes, rank ", i,
                        " sends ", b.size);
        }
        break;
      case OpKind::kAllToAll:
        if (b.size != a.size) {
          return concat("all_to_all size mismatch: rank 0 sends ", a.size,
                        " bytes per rank, rank ", i, " sends ", b.size);
        }
        break;
      case OpKind::kAllReduce:
        if (b.size != a.size || b.elem != a.elem || b.op != a.op) {
          return concat("all_reduce mismatch: rank 0 reduces ", a.size, " ", elem_name(a.elem),
                        " (", reduce_name(a.op), "), rank ", i, " reduces ", b.size, " ",
                        elem_name(b.elem), " (", reduce_name(b.op), ")");
        }
        break;
      case OpKind::kBroadcast:
        if (b.size != a.size || b.root != a.root) {
          return concat("broadcast mismatch: rank 0 has ", a.size, " bytes from root ", a.root,
                        ", rank ", i, " has ", b.size, " bytes from root ", b.root);
        }
        break;
      default:
        break;
    }
  }
  return "";
}

std::string format_counts(std::span<const size_t> counts) {
  std::string s = "[";
  for (size_t i = 0; i < counts.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(counts[i]);
  }
  return s + "]";
}

std::string format_seconds(std::chrono::milliseconds t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(t.count()) / 1000.0);
  return buf;
}

std::string rank_label(int rank, int world_rank, bool is_world) {
  if (is_world) return detail::concat("rank ", rank);
  return detail::concat("rank ", rank, " (world rank ", world_rank, ")");
}

std::string timeout_message(std::chrono::milliseconds t, const std::string& who,
                            const std::string& what) {
  return detail::concat("timeout after ", format_seconds(t), " s: ", who, " waiting for ", what,
                        "; set SEQPAR_TIMEOUT_S to wait longer");
}

std::string peer_failed_message(int world_rank, const std::string& message) {
  return detail::concat("rank ", world_rank, " failed: ", message);
}

}  // namespace comm_rules
}  // namespace seqpar
