// The ring driver: see ring_driver.h for the steps, the receive slots and the zero-copy drain.
#include "ring_driver.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <string>

#include "seqpar/core/error.h"
#include "seqpar/core/timer.h"
#include "seqpar/core/trace.h"

namespace seqpar {

namespace {

// Bytes a receive buffer of that many bytes occupies (Tensor's 64-byte rounding, at least 64).
size_t slot_capacity(size_t bytes) { return std::max<size_t>(64, (bytes + 63) / 64 * 64); }

// One step's transfers: the receives of the next block from prev and the sends of the held block
// to next (with zero copy the sends live in BlockRing until the drain).
struct Transfer {
  std::array<Request, 2 * kMaxRingParts> reqs;  // receives [0, parts), sends [parts, 2·parts)
  std::array<const void*, kMaxRingParts> in{};  // where each received part lies once done
  int parts = 0;
  size_t sent = 0, recv = 0;  // bytes, all parts
  double posted_us = 0;       // --trace: when posted
  double arrived_us = 0;      // --trace: when the receives were first seen complete

  // Tests every request (requests that are done are empty, so testing them again is free).
  void progress() {
    for (Request& rq : reqs) rq.test();
    if (arrived_us == 0 && trace::enabled() && received()) arrived_us = trace::now_us();
  }
  bool received() {
    for (int j = 0; j < parts; ++j)
      if (!reqs[j].test()) return false;
    return true;
  }
};

// Whether member r's own storage serves as slot 1: its block is lent and no block received at an
// odd step (into slot 1) is larger than its own.
bool own_is_slot1(std::span<const int64_t> tokens, int r, KvUse own_use) {
  const int n = static_cast<int>(tokens.size());
  if (own_use == KvUse::kKeep || n <= 1) return false;
  for (int s = 1; s < ring_transfers(n, own_use); s += 2)
    if (tokens[((r - s - 1) % n + n) % n] > tokens[r]) return false;
  return true;
}

// One member's ring: the held block, the two receive slots (copies; slot 1 the own storage when
// lent) or the leases on borrowed blocks and the sends waiting for the drain (zero copy).
class BlockRing {
 public:
  BlockRing(Communicator& comm, const RingPayload& payload)
      : comm_(comm),
        payload_(payload),
        n_(comm.size()),
        next_((comm.rank() + 1) % n_),
        prev_((comm.rank() + n_ - 1) % n_),
        parts_(static_cast<int>(payload.own.size())),
        transfers_(ring_transfers(n_, payload.own_use)),
        borrow_(payload.zero_copy && comm.borrows() && n_ > 1),
        own_slot_(own_is_slot1(payload.tokens, comm.rank(), payload.own_use)),
        sends_(borrow_ ? transfers_ : 0),
        leases_(borrow_ ? transfers_ : 0) {
    SEQPAR_CHECK(parts_ >= 1 && parts_ <= static_cast<int>(kMaxRingParts) &&
                     payload.tags.size() == payload.own.size(),
                 "one tag per part, at most ", kMaxRingParts, " parts");
    SEQPAR_CHECK(static_cast<int>(payload.tokens.size()) == n_, "one block per ring member");
    held_.owner = comm.rank();
    for (int j = 0; j < parts_; ++j) {
      held_.parts[j] = payload.own[j];
      SEQPAR_CHECK(payload.own_use == KvUse::kKeep || payload.own[j]->nbytes() == 0 ||
                       payload.own_storage[j] == payload.own[j]->raw(),
                   "a lent block's storage is its own tensor's");
    }
  }

  int transfers() const { return transfers_; }
  bool zero_copy() const { return borrow_; }
  const RingBlock& held() const { return held_; }
  int next() const { return next_; }
  int prev() const { return prev_; }

  // The block of member `owner` as it arrives: part j's shape and bytes.
  std::vector<int64_t> shape(int j, int owner) const {
    const Tensor& own = *payload_.own[j];
    return {own.dim(0), payload_.tokens[owner], own.dim(2), own.dim(3)};
  }
  size_t bytes(int j, int owner) const {
    const Tensor& own = *payload_.own[j];
    return static_cast<size_t>(own.dim(0) * payload_.tokens[owner] * own.dim(2) * own.dim(3)) *
           dtype_size(own.dtype());
  }

  // Step 1: irecv(prev) of the block of member `incoming` into the free slot, isend(next) of the
  // held block (every part's receive, then every part's send).
  void post(int step, int incoming, Transfer& t) {
    const int slot = step % 2;
    t.parts = parts_;
    for (int j = 0; j < parts_; ++j) {
      const int tag = payload_.tags[j];
      const size_t in_bytes = bytes(j, incoming);
      if (borrow_) {
        // A borrowed block occupies a receive slot as a copied one would (RingTotals::slot_bytes).
        borrowed_[slot][j] = std::max(borrowed_[slot][j], slot_capacity(in_bytes));
        t.reqs[j] = comm_.irecv_borrow(nullptr, in_bytes, prev_, tag, &t.in[j], &leases_[step][j]);
      } else if (slot == 1 && own_slot_) {
        void* in = payload_.own_storage[j];  // the lent own storage (own_is_slot1: it fits)
        t.in[j] = in;
        t.reqs[j] = comm_.irecv(in, in_bytes, prev_, tag);
      } else {
        Tensor& in = slots_[slot][j];
        in.resize(shape(j, incoming), payload_.own[j]->dtype());
        t.in[j] = in.raw();
        t.reqs[j] = comm_.irecv(in.raw(), in.nbytes(), prev_, tag);
      }
      t.recv += in_bytes;
    }
    for (int j = 0; j < parts_; ++j) {
      const Tensor& out = held_[j];
      // Zero copy: the send completes when the receiver drops its lease (drain()).
      Request& send = borrow_ ? sends_[step][j] : t.reqs[parts_ + j];
      send = comm_.isend(out.raw(), out.nbytes(), next_, payload_.tags[j]);
      t.sent += out.nbytes();
    }
  }

  // Step 3: waits for the step's receives and (copies) sends; returns the seconds blocked.
  static double wait(Transfer& t) {
    const double t0 = now_seconds();
    wait_all(t.reqs);  // zero copy: the receives only; the sends settle in drain()
    return now_seconds() - t0;
  }

  // Step 4: the received block (of member `incoming`) becomes the held one.
  void hold(int step, int incoming, const Transfer& t) {
    held_.owner = incoming;
    for (int j = 0; j < parts_; ++j) {
      if (borrow_ || (step % 2 == 1 && own_slot_)) {  // borrowed, or in the own storage
        views_[j] = Tensor::borrow(t.in[j], shape(j, incoming), payload_.own[j]->dtype());
        held_.parts[j] = &views_[j];
      } else {
        held_.parts[j] = &slots_[step % 2][j];
      }
    }
  }

  // kLend with copies, after step N-1's transfer: the own block, received into slot 0 (N odd),
  // copied into the own storage if blocks were received there (in slot 1 it is home already).
  void bring_home(const Transfer& t) {
    if (borrow_ || !own_slot_ || (n_ - 1) % 2 == 1) return;
    for (int j = 0; j < parts_; ++j)
      if (payload_.own[j]->nbytes() > 0)
        std::memcpy(payload_.own_storage[j], t.in[j], payload_.own[j]->nbytes());
  }

  // After the last step (zero copy): the lease of the block held last (never forwarded), then,
  // newest first, each send waited for and the lease of the block it forwarded dropped. Returns
  // the seconds it took.
  double drain() {
    if (!borrow_) return 0;
    const double t0 = now_seconds();
    leases_[transfers_ - 1] = {};
    for (int s = transfers_ - 1; s >= 0; --s) {
      wait_all(sends_[s]);
      if (s > 0) leases_[s - 1] = {};  // the block sent at step s
    }
    return now_seconds() - t0;
  }

  // Slot 1 in the own storage counts nothing (borrowed_[1] then tracks what it would hold).
  int64_t slot_bytes() const {
    int64_t total = allocated_bytes();
    for (int i = 0; i < 2; ++i)
      if (i == 0 || !own_slot_)
        for (size_t b : borrowed_[i]) total += static_cast<int64_t>(b);
    return total;
  }
  int64_t allocated_bytes() const {
    int64_t total = 0;
    for (const auto& slot : slots_)
      for (const Tensor& t : slot) total += static_cast<int64_t>(t.capacity_bytes());
    return total;
  }

 private:
  Communicator& comm_;
  const RingPayload& payload_;
  const int n_, next_, prev_, parts_, transfers_;
  const bool borrow_, own_slot_;
  RingBlock held_;
  // Copies: two receive slots of every part (slot 1 unused when the own storage serves), views
  // of the parts held in the own storage. Zero copy: views of the borrowed parts held, the
  // largest slot each would have needed, every step's sends and the leases on the blocks held
  // at step s+1 (sends before leases: destroyed after them, so a member unwinding on an error
  // first drops what it borrowed, and only then waits for its own lent blocks).
  std::array<std::array<Tensor, kMaxRingParts>, 2> slots_;
  std::array<Tensor, kMaxRingParts> views_;
  std::array<std::array<size_t, kMaxRingParts>, 2> borrowed_{};
  std::vector<std::array<Request, kMaxRingParts>> sends_;
  std::vector<std::array<std::shared_ptr<void>, kMaxRingParts>> leases_;
};

// The slice of one step's transfer, from posting to arrival (--trace).
void trace_transfer(const RingTraceNames& names, int step, const Transfer& t, const BlockRing& ring,
                    bool zero_copy_payload) {
  const double arrived = t.arrived_us > 0 ? t.arrived_us : trace::now_us();
  const std::string name = detail::concat(names.name, " step ", step, " transfer");
  const auto sent = static_cast<int64_t>(t.sent), recv = static_cast<int64_t>(t.recv);
  if (zero_copy_payload) {
    trace::complete(name, "comm", trace::Lane::kComm, t.posted_us, arrived,
                    {{"bytes_sent", sent},
                     {"bytes_recv", recv},
                     {"to", ring.next()},
                     {"from", ring.prev()},
                     {"zero_copy", ring.zero_copy() ? 1 : 0}});
  } else {
    trace::complete(
        name, "comm", trace::Lane::kComm, t.posted_us, arrived,
        {{"bytes_sent", sent}, {"bytes_recv", recv}, {"to", ring.next()}, {"from", ring.prev()}});
  }
}

}  // namespace

int ring_transfers(int n, KvUse own_use) {
  return n <= 1 ? 0 : own_use == KvUse::kLend ? n : n - 1;
}

RingTotals ring_pass(Communicator& comm, const RingPayload& payload, const RingTraceNames& names,
                     const RingStepFn& step_fn) {
  const int n = comm.size(), r = comm.rank();
  BlockRing ring(comm, payload);
  RingTotals totals;
  for (int step = 0; step < n; ++step) {
    const int src = (r + n - step) % n, incoming = (r + n - step - 1) % n;
    const bool last = step + 1 == n, transfers = step < ring.transfers();
    trace::Scope span(trace::enabled() ? detail::concat(names.name, " step ", step) : std::string(),
                      names.category, trace::Lane::kCompute);
    span.arg("block_of", src);
    span.arg(names.tokens_arg, payload.tokens[src]);
    Transfer next;
    next.posted_us = span.active() ? trace::now_us() : 0;
    if (transfers) ring.post(step, incoming, next);  // irecv(prev), isend(next) of the next block
    step_fn(ring.held(), [&next] { next.progress(); });  // compute on the current block
    totals.wait_seconds += BlockRing::wait(next);        // wait
    if (transfers && trace::enabled()) trace_transfer(names, step, next, ring, payload.zero_copy);
    if (last) {
      if (transfers) ring.bring_home(next);  // kLend: the own block is back
      break;
    }
    ring.hold(step, incoming, next);  // swap buffers
  }
  if (ring.zero_copy()) {
    trace::Scope span(trace::enabled() ? detail::concat(names.name, " drain") : std::string(),
                      "comm", trace::Lane::kComm);
    totals.end_sync_seconds = ring.drain();
    totals.wait_seconds += totals.end_sync_seconds;
  }
  totals.slot_bytes = ring.slot_bytes();
  totals.allocated_bytes = ring.allocated_bytes();
  return totals;
}

}  // namespace seqpar
