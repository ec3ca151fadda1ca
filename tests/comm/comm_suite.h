// The backend-independent communicator test suite: each function is called on every rank of a
// fresh world communicator (threads: inside ThreadWorld::run; mpi: on a new mpi_world()) and
// checks one area with gtest EXPECTs. Every rank fills distinct byte patterns, so a block that
// lands in the wrong place is caught. Functions work for any size >= 1 (those that need two
// ranks return at once on one).
// Failure tests (timeout_*, abort_*, checked_faults) leave the communicator's world failed:
// call them on a world of their own.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "seqpar/comm/checked.h"
#include "seqpar/comm/communicator.h"

namespace seqpar::comm_suite {

using std::chrono::milliseconds;

// Byte k of message `msg` that rank `from` sends to rank `to`.
inline uint8_t pattern(int from, int to, size_t k, int msg = 0) {
  return static_cast<uint8_t>(from * 131 + to * 17 + k * 7 + msg * 29 + (k >> 8) + 1);
}

inline std::vector<uint8_t> make_block(int from, int to, size_t n, int msg = 0) {
  std::vector<uint8_t> v(n);
  for (size_t k = 0; k < n; ++k) v[k] = pattern(from, to, k, msg);
  return v;
}

// Checks got[offset, offset + n) against pattern(from, to, ., msg); reports the first bad byte.
inline void expect_block(const uint8_t* got, int from, int to, size_t n, int msg,
                         const std::string& where) {
  for (size_t k = 0; k < n; ++k) {
    if (got[k] != pattern(from, to, k, msg)) {
      ADD_FAILURE() << where << ": byte " << k << " of the block from rank " << from << " to rank "
                    << to << " is " << int(got[k]) << ", want " << int(pattern(from, to, k, msg));
      return;
    }
  }
}

inline void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << text << "' lacks '" << part << "'";
}

// Runs f, which must throw CommError; returns its message ("" and a failure otherwise).
template <typename F>
std::string comm_error_of(F&& f, const std::string& what) {
  try {
    f();
  } catch (const CommError& e) {
    return e.what();
  }
  ADD_FAILURE() << what << ": expected a CommError";
  return "";
}

inline std::string rank_str(int r) { return "rank " + std::to_string(r); }

// ---------------------------------------------------------------------------------------------
// Point to point

inline void identity(Communicator& c) {
  EXPECT_GE(c.size(), 1);
  EXPECT_GE(c.rank(), 0);
  EXPECT_LT(c.rank(), c.size());
  EXPECT_FALSE(c.backend().empty());
  EXPECT_GT(c.timeout().count(), 0);
  c.barrier();
}

// Every rank sends to the next and receives from the previous at once, several sizes.
inline void ring_exchange(Communicator& c) {
  const int n = c.size(), me = c.rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  int msg = 0;
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{13}, size_t{4096}, size_t{1} << 20}) {
    std::vector<uint8_t> out = make_block(me, next, bytes, msg), in(bytes, 0xEE);
    std::vector<Request> reqs;
    reqs.push_back(c.irecv(in.data(), bytes, prev, 3));
    reqs.push_back(c.isend(out.data(), bytes, next, 3));
    wait_all(reqs);
    expect_block(in.data(), prev, me, bytes, msg, "ring_exchange " + std::to_string(bytes));
    ++msg;
  }
  // Send posted before the receive, waited in the opposite order.
  std::vector<uint8_t> out = make_block(me, next, 777, 9), in(777);
  Request s = c.isend(out.data(), out.size(), next, 4);
  Request r = c.irecv(in.data(), in.size(), prev, 4);
  r.wait();
  s.wait();
  s.wait();  // idempotent
  EXPECT_TRUE(s.test());
  expect_block(in.data(), prev, me, 777, 9, "ring_exchange send-first");
}

// irecv_borrow as ring attention uses it: every rank's block travels around the whole ring, each
// rank forwarding the address it received (never copying), all sends settled at the end in
// reverse with the leases dropped in between. On a backend without borrowing (borrows() false)
// the same code receives copies. Data, stats and completion must be the same either way.
inline void borrow_ring(Communicator& c) {
  const int n = c.size(), me = c.rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  if (n == 1) return;
  constexpr size_t kBytes = 3000;
  const std::vector<uint8_t> own = make_block(me, me, kBytes, 5);
  std::vector<std::vector<uint8_t>> bufs(n - 1, std::vector<uint8_t>(kBytes, 0xEE));
  std::vector<Request> sends;
  std::vector<std::shared_ptr<void>> leases(n - 1);
  const CommStats before = c.stats();
  const uint8_t* held = own.data();
  for (int step = 0; step + 1 < n; ++step) {
    const void* in = nullptr;
    Request rq = c.irecv_borrow(bufs[step].data(), kBytes, prev, 6, &in, &leases[step]);
    sends.push_back(c.isend(held, kBytes, next, 6));
    rq.wait();
    ASSERT_NE(in, nullptr);
    held = static_cast<const uint8_t*>(in);
    const int owner = (me + n - step - 1) % n;
    expect_block(held, owner, owner, kBytes, 5, "borrow_ring step " + std::to_string(step));
    if (c.borrows()) {
      EXPECT_NE(in, static_cast<const void*>(bufs[step].data())) << "borrowed, not copied";
    } else {
      EXPECT_EQ(in, static_cast<const void*>(bufs[step].data()));
    }
  }
  leases[n - 2].reset();
  for (int s = n - 2; s >= 0; --s) {
    sends[s].wait();
    if (s > 0) leases[s - 1].reset();
  }
  const size_t k = static_cast<size_t>(OpKind::kSendRecv);
  EXPECT_EQ(c.stats().bytes_sent[k] - before.bytes_sent[k], kBytes * (n - 1));
  EXPECT_EQ(c.stats().bytes_recv[k] - before.bytes_recv[k], kBytes * (n - 1));
  c.barrier();
}

// K messages with one tag between every pair arrive in send order.
inline void same_tag_ordering(Communicator& c) {
  const int n = c.size(), me = c.rank();
  constexpr int kMessages = 8;
  auto len = [](int m) { return size_t{64} + 16 * static_cast<size_t>(m); };
  std::vector<std::vector<uint8_t>> out, in;
  std::vector<Request> reqs;
  for (int j = 0; j < n; ++j) {
    for (int m = 0; m < kMessages; ++m) in.emplace_back(len(m), 0);
  }
  // First half of the receives before any send, the rest after.
  for (int j = 0; j < n; ++j) {
    for (int m = 0; m < kMessages / 2; ++m) {
      auto& buf = in[j * kMessages + m];
      reqs.push_back(c.irecv(buf.data(), buf.size(), j, 5));
    }
  }
  for (int j = 0; j < n; ++j) {
    for (int m = 0; m < kMessages; ++m) {
      out.push_back(make_block(me, j, len(m), m));
      reqs.push_back(c.isend(out.back().data(), out.back().size(), j, 5));
    }
  }
  for (int j = 0; j < n; ++j) {
    for (int m = kMessages / 2; m < kMessages; ++m) {
      auto& buf = in[j * kMessages + m];
      reqs.push_back(c.irecv(buf.data(), buf.size(), j, 5));
    }
  }
  wait_all(reqs);
  for (int j = 0; j < n; ++j) {
    for (int m = 0; m < kMessages; ++m) {
      expect_block(in[j * kMessages + m].data(), j, me, len(m), m,
                   "same_tag_ordering message " + std::to_string(m));
    }
  }
}

// A receive matches only its tag, even when posted in the other order.
inline void tags_do_not_cross(Communicator& c) {
  const int n = c.size(), me = c.rank();
  if (n < 2) return;
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  std::vector<uint8_t> a = make_block(me, next, 100, 1), b = make_block(me, next, 100, 2);
  std::vector<uint8_t> ra(100), rb(100);
  Request rq_b = c.irecv(rb.data(), rb.size(), prev, 2);
  Request rq_a = c.irecv(ra.data(), ra.size(), prev, 1);
  Request s1 = c.isend(a.data(), a.size(), next, 1);
  Request s2 = c.isend(b.data(), b.size(), next, 2);
  rq_a.wait();
  rq_b.wait();
  s2.wait();
  s1.wait();
  expect_block(ra.data(), prev, me, 100, 1, "tag 1");
  expect_block(rb.data(), prev, me, 100, 2, "tag 2");
}

// A receive of the wrong size fails with a clear error at the receiver.
inline void p2p_size_mismatch(Communicator& c) {
  const int n = c.size(), me = c.rank();
  if (n < 2) return;
  if (me == 0) {
    std::vector<uint8_t> out(10, 1);
    Request s = c.isend(out.data(), out.size(), 1, 6);
    try {  // the threads backend fails the send too; MPI completes it
      s.wait();
    } catch (const CommError& e) {
      expect_contains(e.what(), "size mismatch");
    }
  } else if (me == 1) {
    std::vector<uint8_t> in(20);
    Request r = c.irecv(in.data(), in.size(), 0, 6);
    std::string msg = comm_error_of([&] { r.wait(); }, "p2p_size_mismatch");
    expect_contains(msg, "size mismatch");
    // The failure is stored: waiting again rethrows it.
    std::string again = comm_error_of([&] { r.wait(); }, "p2p_size_mismatch again");
    EXPECT_EQ(msg, again);
  }
  c.barrier();  // a size mismatch is local: the group stays usable
}

// ---------------------------------------------------------------------------------------------
// Collectives

inline void all_gather(Communicator& c) {
  const int n = c.size(), me = c.rank();
  int msg = 0;
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{3} << 16}) {
    std::vector<uint8_t> out = make_block(me, 0, bytes, msg), in(bytes * n, 0xEE);
    c.all_gather(out.data(), bytes, in.data());
    for (int i = 0; i < n; ++i) {
      expect_block(in.data() + i * bytes, i, 0, bytes, msg, "all_gather " + std::to_string(bytes));
    }
    // In place: this rank's block already sits at its offset of recv.
    std::vector<uint8_t> io(bytes * n, 0xEE);
    std::copy(out.begin(), out.end(), io.begin() + me * bytes);
    c.all_gather(io.data() + me * bytes, bytes, io.data());
    for (int i = 0; i < n; ++i) {
      expect_block(io.data() + i * bytes, i, 0, bytes, msg, "all_gather in place");
    }
    ++msg;
  }
}

inline void all_gatherv(Communicator& c) {
  const int n = c.size(), me = c.rank();
  std::vector<std::vector<size_t>> cases;
  cases.emplace_back();
  for (int i = 0; i < n; ++i) cases.back().push_back(static_cast<size_t>(i * 37 % 5) * 3);
  cases.emplace_back(n, 0);
  cases.back()[n - 1] = 1000;  // one rank holds everything
  cases.emplace_back(n, 0);    // nothing at all
  cases.emplace_back();
  for (int i = 0; i < n; ++i) cases.back().push_back(1000 + static_cast<size_t>(i));
  int msg = 0;
  for (const auto& counts : cases) {
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    std::vector<uint8_t> out = make_block(me, 0, counts[me], msg), in(total, 0xEE);
    c.all_gatherv(out.data(), in.data(), counts);
    size_t off = 0;
    for (int i = 0; i < n; ++i) {
      expect_block(in.data() + off, i, 0, counts[i], msg,
                   "all_gatherv case " + std::to_string(msg));
      off += counts[i];
    }
    ++msg;
  }
}

inline void all_to_all(Communicator& c) {
  const int n = c.size(), me = c.rank();
  int msg = 0;
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{33}, size_t{8192}}) {
    std::vector<uint8_t> out(bytes * n), in(bytes * n, 0xEE);
    for (int j = 0; j < n; ++j) {
      auto blk = make_block(me, j, bytes, msg);
      std::copy(blk.begin(), blk.end(), out.begin() + j * bytes);
    }
    c.all_to_all(out.data(), in.data(), bytes);
    for (int i = 0; i < n; ++i) {
      expect_block(in.data() + i * bytes, i, me, bytes, msg, "all_to_all " + std::to_string(bytes));
    }
    ++msg;
  }
}

inline void all_to_allv(Communicator& c) {
  const int n = c.size(), me = c.rank();
  // Bytes rank i sends to rank j, zeros included.
  auto count_a = [](int i, int j) { return static_cast<size_t>((i + 2 * j) % 4) * 5; };
  auto count_b = [n](int i, int j) { return static_cast<size_t>((i * n + j) * 3 % 7) * 11; };
  auto count_c = [](int i, int j) { return i == j ? size_t{50} : size_t{0}; };  // only self
  int msg = 0;
  for (auto count : std::vector<std::function<size_t(int, int)>>{count_a, count_b, count_c}) {
    std::vector<size_t> sc(n), rc(n);
    for (int j = 0; j < n; ++j) {
      sc[j] = count(me, j);
      rc[j] = count(j, me);
    }
    std::vector<uint8_t> out, in(std::accumulate(rc.begin(), rc.end(), size_t{0}), 0xEE);
    for (int j = 0; j < n; ++j) {
      auto blk = make_block(me, j, sc[j], msg);
      out.insert(out.end(), blk.begin(), blk.end());
    }
    c.all_to_allv(out.data(), sc, in.data(), rc);
    size_t off = 0;
    for (int i = 0; i < n; ++i) {
      expect_block(in.data() + off, i, me, rc[i], msg, "all_to_allv case " + std::to_string(msg));
      off += rc[i];
    }
    ++msg;
  }
}

inline void all_reduce(Communicator& c) {
  const int n = c.size(), me = c.rank();
  for (size_t len : {size_t{0}, size_t{1}, size_t{3}, size_t{1000}}) {
    // f64 sum, exact: sum_r (r + k/2) = n(n-1)/2 + n·k/2
    std::vector<double> d(len);
    for (size_t k = 0; k < len; ++k) d[k] = me + 0.5 * k;
    c.all_reduce(d.data(), len, Communicator::Elem::kF64, ReduceOp::kSum);
    for (size_t k = 0; k < len; ++k) {
      ASSERT_EQ(d[k], n * (n - 1) / 2.0 + n * 0.5 * k) << "f64 sum, element " << k;
    }
    // f32 max through the span wrapper: max_r ((r * 7 + k) % n)
    std::vector<float> f(len);
    for (size_t k = 0; k < len; ++k) f[k] = static_cast<float>((me * 7 + k) % n);
    c.all_reduce(std::span<float>(f), ReduceOp::kMax);
    for (size_t k = 0; k < len; ++k) {
      float want = 0;
      for (int r = 0; r < n; ++r) want = std::max(want, static_cast<float>((r * 7 + k) % n));
      ASSERT_EQ(f[k], want) << "f32 max, element " << k;
    }
    // i64 sum beyond 32 bits, and i64 max with negatives
    std::vector<int64_t> a(len), b(len);
    for (size_t k = 0; k < len; ++k) {
      a[k] = (int64_t{1} << 40) * me + static_cast<int64_t>(k);
      b[k] = -static_cast<int64_t>(k) * 1000 + me;
    }
    c.all_reduce(std::span<int64_t>(a), ReduceOp::kSum);
    c.all_reduce(std::span<int64_t>(b), ReduceOp::kMax);
    for (size_t k = 0; k < len; ++k) {
      ASSERT_EQ(a[k], (int64_t{1} << 40) * (n * (n - 1) / 2) + n * static_cast<int64_t>(k));
      ASSERT_EQ(b[k], -static_cast<int64_t>(k) * 1000 + (n - 1));
    }
    // f32 sum, exact on small integers; f64 max
    std::vector<float> s(len);
    std::vector<double> m(len);
    for (size_t k = 0; k < len; ++k) {
      s[k] = static_cast<float>(me + k);
      m[k] = -1.0e300 / (me + 1);
    }
    c.all_reduce(s.data(), len, Communicator::Elem::kF32, ReduceOp::kSum);
    c.all_reduce(std::span<double>(m), ReduceOp::kMax);
    for (size_t k = 0; k < len; ++k) {
      ASSERT_EQ(s[k], static_cast<float>(n * (n - 1) / 2 + n * static_cast<int64_t>(k)));
      ASSERT_EQ(m[k], -1.0e300 / n);
    }
  }
  EXPECT_EQ(c.all_reduce_max(static_cast<double>(me)), n - 1);
  EXPECT_EQ(c.all_reduce_sum(1.5), 1.5 * n);
  // Inexact f32 sums give the same bits on every rank.
  std::vector<float> x(257);
  for (size_t k = 0; k < x.size(); ++k) x[k] = 0.1f * static_cast<float>(me + 1) / (k + 3);
  c.all_reduce(std::span<float>(x), ReduceOp::kSum);
  std::vector<float> all(x.size() * n);
  c.all_gather(x.data(), x.size() * sizeof(float), all.data());
  for (int i = 1; i < n; ++i) {
    EXPECT_EQ(0, std::memcmp(all.data(), all.data() + i * x.size(), x.size() * sizeof(float)))
        << "rank " << i << " got different f32 sums than rank 0";
  }
}

inline void broadcast(Communicator& c) {
  const int n = c.size(), me = c.rank();
  int msg = 0;
  for (int root = 0; root < n; ++root) {
    for (size_t bytes : {size_t{0}, size_t{5}, size_t{70000}}) {
      std::vector<uint8_t> buf =
          me == root ? make_block(root, 0, bytes, msg) : std::vector<uint8_t>(bytes, 0xEE);
      c.broadcast(buf.data(), bytes, root);
      expect_block(buf.data(), root, 0, bytes, msg, "broadcast from " + std::to_string(root));
      ++msg;
    }
  }
}

inline void barrier(Communicator& c) {
  for (int i = 0; i < 20; ++i) c.barrier();
  // A barrier separates point-to-point phases.
  const int n = c.size(), me = c.rank();
  int v = me, got = -1;
  Request r = c.irecv(&got, sizeof got, (me + n - 1) % n, 8);
  c.barrier();
  Request s = c.isend(&v, sizeof v, (me + 1) % n, 8);
  r.wait();
  s.wait();
  EXPECT_EQ(got, (me + n - 1) % n);
}

// ---------------------------------------------------------------------------------------------
// Sub-groups

inline void split_groups(Communicator& c) {
  const int n = c.size(), me = c.rank();
  const CommStats before = c.stats();

  // Parity groups, run concurrently: each gathers its members' world ranks and reduces.
  auto parity = c.split(me % 2, me);
  ASSERT_TRUE(parity);
  EXPECT_EQ(parity->size(), (n - me % 2 + 1) / 2);
  EXPECT_EQ(parity->rank(), me / 2);
  EXPECT_EQ(parity->backend(), c.backend());
  std::vector<int> members(parity->size());
  parity->all_gather(&me, sizeof me, members.data());
  for (int i = 0; i < parity->size(); ++i) EXPECT_EQ(members[i], me % 2 + 2 * i);
  // A parent collective between two sub-group collectives.
  EXPECT_EQ(c.all_reduce_sum(1.0), n);
  double sum = parity->all_reduce_sum(me);
  double want = 0;
  for (int r = me % 2; r < n; r += 2) want += r;
  EXPECT_EQ(sum, want);

  // Pairs, in reverse key order: rank 2p+1 becomes rank 0 of its pair.
  auto pair = c.split(me / 2, -me);
  ASSERT_TRUE(pair);
  const int pair_size = std::min(2, n - (me / 2) * 2);
  EXPECT_EQ(pair->size(), pair_size);
  EXPECT_EQ(pair->rank(), pair_size == 2 ? 1 - me % 2 : 0);

  // Same tag, same two world ranks, three communicators: nothing crosses. Ring inside every
  // parity group at the same time as inside the parent.
  {
    const int pn = parity->size(), pr = parity->rank();
    std::vector<uint8_t> to_parent = make_block(me, (me + 1) % n, 256, 40);
    std::vector<uint8_t> to_sub = make_block(me, 1000 + (pr + 1) % pn, 256, 41);
    std::vector<uint8_t> from_parent(256), from_sub(256);
    std::vector<Request> reqs;
    reqs.push_back(parity->irecv(from_sub.data(), 256, (pr + pn - 1) % pn, 0));
    reqs.push_back(c.irecv(from_parent.data(), 256, (me + n - 1) % n, 0));
    reqs.push_back(c.isend(to_parent.data(), 256, (me + 1) % n, 0));
    reqs.push_back(parity->isend(to_sub.data(), 256, (pr + 1) % pn, 0));
    wait_all(reqs);
    expect_block(from_parent.data(), (me + n - 1) % n, me, 256, 40, "parent ring");
    const int prev_world = me % 2 + 2 * ((pr + pn - 1) % pn);
    expect_block(from_sub.data(), prev_world, 1000 + pr, 256, 41, "parity ring");
  }
  if (pair_size == 2) {
    // World ranks 2p and 2p+1 talk on both the parent and their pair with the same tag.
    const int other = me ^ 1;
    std::vector<uint8_t> on_pair = make_block(me, other, 64, 50),
                         on_parent = make_block(me, other, 64, 51);
    std::vector<uint8_t> got_pair(64), got_parent(64);
    Request rp = pair->irecv(got_pair.data(), 64, 1 - pair->rank(), 9);
    Request rw = c.irecv(got_parent.data(), 64, other, 9);
    Request sw = c.isend(on_parent.data(), 64, other, 9);
    Request sp = pair->isend(on_pair.data(), 64, 1 - pair->rank(), 9);
    rw.wait();
    rp.wait();
    sw.wait();
    sp.wait();
    expect_block(got_pair.data(), other, me, 64, 50, "pair message");
    expect_block(got_parent.data(), other, me, 64, 51, "parent message");
  }

  // Split of a split, and every group's collective after another's.
  auto nested = parity->split(0, parity->size() - parity->rank());
  ASSERT_TRUE(nested);
  EXPECT_EQ(nested->size(), parity->size());
  EXPECT_EQ(nested->rank(), parity->size() - 1 - parity->rank());
  int top = nested->rank() == 0 ? me : -1;
  nested->broadcast(&top, sizeof top, 0);
  EXPECT_EQ(top, me % 2 + 2 * (parity->size() - 1));
  pair->barrier();
  c.barrier();

  // A negative color leaves a rank out.
  auto rest = c.split(me == 0 ? -1 : 7, 0);
  EXPECT_EQ(rest == nullptr, me == 0);
  if (rest) {
    EXPECT_EQ(rest->size(), n - 1);
    EXPECT_EQ(rest->rank(), me - 1);
    EXPECT_EQ(rest->all_reduce_sum(1.0), n - 1);
  }
  // Splitting is not traffic: the parent's counters moved only for its own ops above.
  EXPECT_EQ(c.stats().ops[static_cast<size_t>(OpKind::kSendRecv)],
            before.ops[static_cast<size_t>(OpKind::kSendRecv)] + 2 + (pair_size == 2 ? 2 : 0));
  EXPECT_EQ(c.stats().ops[static_cast<size_t>(OpKind::kAllReduce)],
            before.ops[static_cast<size_t>(OpKind::kAllReduce)] + 1);
  EXPECT_EQ(c.stats().ops[static_cast<size_t>(OpKind::kAllGather)],
            before.ops[static_cast<size_t>(OpKind::kAllGather)]);
}

// ---------------------------------------------------------------------------------------------
// Byte accounting

inline void stats_exact(Communicator& c) {
  const int n = c.size(), me = c.rank();
  const uint64_t others = static_cast<uint64_t>(n - 1);
  c.stats().reset();
  // send_recv: 100 bytes to the next rank, 100 from the previous (both self when n == 1)
  std::vector<uint8_t> a(100, 1), b(100);
  Request r = c.irecv(b.data(), 100, (me + n - 1) % n, 1);
  Request s = c.isend(a.data(), 100, (me + 1) % n, 1);
  r.wait();
  s.wait();
  // all_gather 64 bytes, all_gatherv counts 10·(i+1)
  std::vector<uint8_t> g(64 * n), gv(10 * n * (n + 1) / 2);
  c.all_gather(a.data(), 64, g.data());
  std::vector<size_t> counts(n);
  for (int i = 0; i < n; ++i) counts[i] = 10 * static_cast<size_t>(i + 1);
  std::vector<uint8_t> mine(counts[me]);
  c.all_gatherv(mine.data(), gv.data(), counts);
  // all_to_all 8 bytes per rank, all_to_allv i -> j: i + 2j + 1 bytes
  std::vector<uint8_t> t_out(8 * n), t_in(8 * n);
  c.all_to_all(t_out.data(), t_in.data(), 8);
  std::vector<size_t> sc(n), rc(n);
  for (int j = 0; j < n; ++j) {
    sc[j] = static_cast<size_t>(me + 2 * j + 1);
    rc[j] = static_cast<size_t>(j + 2 * me + 1);
  }
  std::vector<uint8_t> v_out(std::accumulate(sc.begin(), sc.end(), size_t{0})),
      v_in(std::accumulate(rc.begin(), rc.end(), size_t{0}));
  c.all_to_allv(v_out.data(), sc, v_in.data(), rc);
  // all_reduce 5 doubles, broadcast 1000 bytes from the last rank, two barriers
  double d[5] = {1, 2, 3, 4, 5};
  c.all_reduce(d, 5, Communicator::Elem::kF64, ReduceOp::kSum);
  std::vector<uint8_t> bc(1000);
  c.broadcast(bc.data(), 1000, n - 1);
  c.barrier();
  c.barrier();

  uint64_t gv_recv = 0, av_sent = 0, av_recv = 0;
  for (int i = 0; i < n; ++i) {
    if (i == me) continue;
    gv_recv += 10 * static_cast<uint64_t>(i + 1);
    av_sent += static_cast<uint64_t>(me + 2 * i + 1);
    av_recv += static_cast<uint64_t>(i + 2 * me + 1);
  }
  struct Want {
    OpKind kind;
    uint64_t sent, recv, ops;
  };
  const Want want[] = {
      {OpKind::kSendRecv, n > 1 ? 100u : 0u, n > 1 ? 100u : 0u, 2},
      {OpKind::kAllGather, 64 * others + 10 * static_cast<uint64_t>(me + 1) * others,
       64 * others + gv_recv, 2},
      {OpKind::kAllToAll, 8 * others + av_sent, 8 * others + av_recv, 2},
      {OpKind::kAllReduce, 40 * others, 40 * others, 1},
      {OpKind::kBroadcast, me == n - 1 ? 1000 * others : 0, me == n - 1 ? 0u : 1000u, 1},
      {OpKind::kBarrier, 0, 0, 2},
  };
  const CommStats& st = c.stats();
  uint64_t total_sent = 0, total_recv = 0;
  for (const Want& w : want) {
    const auto k = static_cast<size_t>(w.kind);
    EXPECT_EQ(st.bytes_sent[k], w.sent) << op_kind_name(w.kind) << " sent, rank " << me;
    EXPECT_EQ(st.bytes_recv[k], w.recv) << op_kind_name(w.kind) << " recv, rank " << me;
    EXPECT_EQ(st.ops[k], w.ops) << op_kind_name(w.kind) << " ops, rank " << me;
    total_sent += w.sent;
    total_recv += w.recv;
  }
  EXPECT_EQ(st.total_sent(), total_sent);
  EXPECT_EQ(st.total_recv(), total_recv);
  // Over all ranks, every logical byte sent is received.
  uint64_t totals[2] = {st.total_sent(), st.total_recv()};
  std::vector<uint64_t> all(2 * n);
  c.all_gather(totals, sizeof totals, all.data());
  uint64_t sum_sent = 0, sum_recv = 0;
  for (int i = 0; i < n; ++i) {
    sum_sent += all[2 * i];
    sum_recv += all[2 * i + 1];
  }
  EXPECT_EQ(sum_sent, sum_recv);
}

// ---------------------------------------------------------------------------------------------
// Failures (each leaves the world failed)

// Rank 1 waits 200 ms for a message rank 0 never sends: its wait names the op and the fix;
// every other rank's next call reports rank 1's failure.
inline void timeout_on_missing_send(Communicator& c) {
  const int n = c.size(), me = c.rank();
  if (n < 2) return;
  if (me == 1) {
    c.set_timeout(milliseconds(200));
    std::vector<uint8_t> buf(16);
    Request r = c.irecv(buf.data(), buf.size(), 0, 7);
    std::string msg = comm_error_of([&] { r.wait(); }, "recv from a silent rank");
    expect_contains(msg, "timeout after 0.2 s: rank 1 waiting for recv from rank 0 (tag 7)");
    expect_contains(msg, "SEQPAR_TIMEOUT_S");
  } else {
    c.set_timeout(milliseconds(20000));
    std::string msg = comm_error_of([&] { c.barrier(); }, "barrier after a peer timed out");
    expect_contains(msg, "rank 1 failed: timeout after 0.2 s");
  }
  // Afterwards every call of every rank fails at once.
  std::string msg = comm_error_of([&] { c.barrier(); }, "barrier in a failed world");
  expect_contains(msg, "rank 1 failed");
}

// The last rank calls abort(); every rank's next collective names it.
inline void abort_propagates(Communicator& c) {
  const int n = c.size(), me = c.rank();
  if (n < 2) return;
  c.set_timeout(milliseconds(20000));
  const int culprit = n - 1;
  if (me == culprit) c.abort("boom from the test");
  std::string msg = comm_error_of([&] { c.barrier(); }, "barrier after abort");
  expect_contains(msg, rank_str(culprit) + " failed: boom from the test");
  std::vector<uint8_t> buf(8);
  std::vector<uint8_t> gathered(n);
  msg = comm_error_of([&] { c.all_gather(buf.data(), 1, gathered.data()); },
                      "all_gather after abort");
  expect_contains(msg, rank_str(culprit) + " failed");
  msg = comm_error_of([&] { c.isend(buf.data(), 1, 0, 0); }, "isend after abort");
  expect_contains(msg, rank_str(culprit) + " failed");
}

// A pending receive fails when a peer aborts while it waits.
inline void abort_wakes_pending_recv(Communicator& c) {
  const int n = c.size(), me = c.rank();
  if (n < 2) return;
  c.set_timeout(milliseconds(20000));
  if (me == 0) {
    c.barrier();  // everyone's receive is posted before the abort
    std::this_thread::sleep_for(milliseconds(50));
    c.abort("rank 0 gives up");
  } else {
    std::vector<uint8_t> buf(8);
    Request r = c.irecv(buf.data(), buf.size(), 0, 3);
    // On mpi the barrier itself may still be completing here when the abort arrives; then it
    // fails instead of the receive. Either way the error names rank 0.
    std::string msg = comm_error_of(
        [&] {
          c.barrier();
          r.wait();
        },
        "recv while the sender aborts");
    expect_contains(msg, "rank 0 failed: rank 0 gives up");
  }
}

// ---------------------------------------------------------------------------------------------
// CheckedCommunicator

// Mismatched collectives are reported on every rank, the same way, and leave the group usable.
inline void checked_mismatches(Communicator& c) {
  const int n = c.size(), me = c.rank();
  CheckedCommunicator cc(c);
  EXPECT_EQ(cc.rank(), me);
  EXPECT_EQ(cc.size(), n);
  EXPECT_EQ(cc.backend(), c.backend());
  std::vector<uint8_t> out = make_block(me, 0, 4096), in(4096 * n);
  cc.all_gather(out.data(), 4096, in.data());
  for (int i = 0; i < n; ++i) expect_block(in.data() + 4096 * i, i, 0, 4096, 0, "checked");
  if (n < 2) return;
  const int last = n - 1;

  std::string msg = comm_error_of(
      [&] { cc.all_gather(out.data(), me == last ? 2048 : 4096, in.data()); }, "size mismatch");
  EXPECT_EQ(msg, "all_gather size mismatch: rank 0 sends 4096 bytes, rank " + std::to_string(last) +
                     " sends 2048");

  msg = comm_error_of(
      [&] {
        if (me == 0) {
          cc.barrier();
        } else {
          cc.broadcast(out.data(), 16, 0);
        }
      },
      "op mismatch");
  EXPECT_EQ(msg, "collective mismatch: rank 0 calls barrier, rank 1 calls broadcast");

  // all_to_allv: rank 0 expects 3 bytes from rank 1, which sends 2.
  std::vector<size_t> sc(n, 2), rc(n, 2);
  if (me == 0) rc[1] = 3;
  std::vector<uint8_t> a2a_out(2 * n), a2a_in(2 * n + 1);
  msg = comm_error_of([&] { cc.all_to_allv(a2a_out.data(), sc, a2a_in.data(), rc); },
                      "all_to_allv mismatch");
  EXPECT_EQ(msg,
            "all_to_allv count mismatch: rank 1 sends 2 bytes to rank 0, rank 0 expects 3 "
            "from rank 1");

  std::vector<size_t> counts(n, 4);
  if (me == last) counts[0] = 5;
  std::vector<uint8_t> gv(5 * n);
  msg = comm_error_of([&] { cc.all_gatherv(gv.data(), gv.data() + 8, counts); },
                      "all_gatherv mismatch");
  expect_contains(msg, "all_gatherv counts mismatch: rank 0 has counts [4, 4");
  expect_contains(msg, "rank " + std::to_string(last) + " has [5, 4");

  std::vector<double> d(4);
  msg = comm_error_of(
      [&] {
        cc.all_reduce(d.data(), me == last ? 3 : 4, Communicator::Elem::kF64, ReduceOp::kSum);
      },
      "all_reduce mismatch");
  EXPECT_EQ(msg, "all_reduce mismatch: rank 0 reduces 4 f64 (sum), rank " + std::to_string(last) +
                     " reduces 3 f64 (sum)");

  msg = comm_error_of([&] { cc.broadcast(out.data(), 16, me == last ? 1 : 0); },
                      "broadcast mismatch");
  EXPECT_EQ(msg, "broadcast mismatch: rank 0 has 16 bytes from root 0, rank " +
                     std::to_string(last) + " has 16 bytes from root 1");

  // Still usable, and the wrapper counts only the forwarded ops (the checks' own all-gathers
  // land in the inner communicator's stats).
  cc.stats().reset();
  const CommStats inner_before = c.stats();
  cc.all_gather(out.data(), 4096, in.data());
  for (int i = 0; i < n; ++i) expect_block(in.data() + 4096 * i, i, 0, 4096, 0, "checked after");
  const auto k = static_cast<size_t>(OpKind::kAllGather);
  EXPECT_EQ(cc.stats().bytes_sent[k], 4096u * (n - 1));
  EXPECT_EQ(cc.stats().ops[k], 1u);
  EXPECT_EQ(c.stats().ops[k], inner_before.ops[k] + 2);
  auto sub = cc.split(me % 2, 0);
  ASSERT_TRUE(sub);
  EXPECT_EQ(sub->all_reduce_sum(1.0), sub->size());
}

// Injected faults: a delay changes nothing; a throw on one rank fails every rank.
inline void checked_faults(Communicator& c) {
  const int n = c.size(), me = c.rank();
  c.set_timeout(milliseconds(20000));
  CheckedCommunicator cc(c);
  cc.inject_delay(0, 1, milliseconds(30));
  cc.inject_throw(n - 1, 3);
  std::vector<uint8_t> out = make_block(me, 0, 32), in(32 * n);
  cc.all_gather(out.data(), 32, in.data());  // op 1: delayed on rank 0
  for (int i = 0; i < n; ++i) expect_block(in.data() + 32 * i, i, 0, 32, 0, "delayed");
  // Op 2 is a barrier; op 3 throws on the last rank. On mpi a rank may still be completing the
  // barrier when the failure arrives, and then the barrier reports it.
  std::string msg = comm_error_of(
      [&] {
        cc.barrier();
        EXPECT_EQ(cc.ops_seen(), 2);
        cc.all_gather(out.data(), 32, in.data());
      },
      "op 3");
  if (me == n - 1) {
    EXPECT_EQ(msg, "injected fault: rank " + std::to_string(n - 1) + " fails at op 3 (all_gather)");
  } else {
    expect_contains(msg, rank_str(n - 1) + " failed: injected fault");
  }
}

// A rank that silently skips a collective makes the others time out, never hang.
inline void checked_drop(Communicator& c) {
  const int n = c.size(), me = c.rank();
  if (n < 2) return;
  CheckedCommunicator cc(c);
  cc.inject_drop(n - 1, 1);
  if (me == n - 1) {
    cc.set_timeout(milliseconds(20000));
    cc.barrier();  // dropped: returns at once
    std::vector<uint8_t> buf(4);
    Request r = c.irecv(buf.data(), buf.size(), 0, 11);  // never sent: ends by the others' failure
    std::string msg = comm_error_of([&] { r.wait(); }, "dropped rank");
    expect_contains(msg, "failed: timeout");
  } else {
    cc.set_timeout(milliseconds(300));
    std::string msg = comm_error_of([&] { cc.barrier(); }, "barrier missing a rank");
    expect_contains(msg, "timeout after 0.3 s");
  }
}

}  // namespace seqpar::comm_suite
