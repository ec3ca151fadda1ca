// The ring driver (private to src/parallel/): blocks travel around the ring of a communicator's
// members while each member computes on the block it holds. One driver for every ring:
//   ring (pass-KV) over a sharded sequence, passkv over a cache, steal and usp's ring part
//     (ring_over_blocks, ring.cc): the blocks are K and V;
//   ring pass-Q (passq_ring.cc): the blocks are the queries of the new tokens.
//
// On member r of N, next = r+1, prev = r-1 (mod N); at step s (0 <= s < N) it holds the block of
// member r-s (its own at s = 0):
//   1. if s < N-1: post irecv(prev) of the block of member r-s-1 into the free receive slot and
//      isend(next) of the held block
//   2. compute on the held block (the caller's step function), testing the transfers for progress
//   3. wait for the transfers
//   4. swap: the received block becomes the held one
// Holder of block (member i holds, at step s, the block of member i-s), N = 4:
//   step     member 0   member 1   member 2   member 3
//   0        0          1          2          3
//   1        3          0          1          2
//   2        2          3          0          1
//   3        1          2          3          0
// Over N-1 transfers member r sends every block but that of member r+1 and receives every block
// but its own.
//
// Receive slots: two, used alternately (slot s mod 2 refilled at step s), so a slot is refilled
// only after its send and its compute finished at step s-1; each grows to the largest block it
// received.
// Lent own block (RingPayload::own_use kLend or kConsume, copying backends): the own block's
// storage is slot 1 (refilled at the odd steps, the first time at step 1, after the own block's
// send and compute at step 0 finished), so a member holds its own storage plus slot 0: 2 blocks
// where kKeep holds 3. A member whose own storage is smaller than a block received at an odd step
// (uneven shards) keeps it and uses two slots of its own (all members still make the same
// transfers). kLend brings the own block home: step N-1 also transfers, the held block (that of
// member r+1) to next and from prev the own block, which lands in the own storage when N is even
// and in slot 0 when N is odd (then copied home after the wait): N transfers, each member sends
// and receives one more block. kConsume makes N-1 transfers and returns with the own storage
// holding the last block received at an odd step (that of member r-2 for N = 3 or 4; its own
// for N <= 2).
// With zero copy the storage is never written; kLend's step N-1 borrows too (the same bytes
// counted), and RingTotals count slot 1 in the own storage as with copies.
// Zero copy (RingPayload::zero_copy and comm.borrows(): ranks share memory, the threads backend):
// every block in flight is some member's own block, which no member modifies during the call, so
// nothing is copied: step 1 receives with irecv_borrow (the address of the sender's block, and a
// lease on it) and the next step forwards that address. Sends are not waited per step (a send
// completes when its receiver drops the lease); after the last step each member drops the lease
// of the block it held last (never forwarded), then, from the last send back to the first, waits
// for the send and drops the lease of the block it sent (which completes its sender's send).
// Every chain of borrows ends at a member that releases without waiting, so this drain cannot
// deadlock, and no member returns while another still reads its block. CommStats count the same
// logical bytes either way.
//
// Trace events (trace::enabled()): per step "<name> step s" (its category, compute lane; args
// block_of and the tokens' name), per transfer "<name> step s transfer" (comm lane, from posting
// to arrival; args bytes_sent, bytes_recv, to, from and, for zero-copy payloads, zero_copy), and
// the drain "<name> drain" (comm lane).
// Thread-safety: one call per member (thread or process); the payload's tensors must stay
// unchanged until the call returns (peers may read them in place), but for the own storage a
// lent block's member writes (nobody else may read it during the call).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "seqpar/comm/communicator.h"
#include "seqpar/core/tensor.h"
#include "seqpar/parallel/strategies.h"

namespace seqpar {

// Tensors of one block that travel together: K and V, or Q.
inline constexpr size_t kMaxRingParts = 2;

// What travels: this member's block and the token count of every member's block. Every part is
// (B, tokens, heads_j, D); a received part has the shape and dtype of the own one, with the
// sender's token count.
struct RingPayload {
  std::vector<const Tensor*> own;  // this member's block, one tensor per part
  std::vector<int> tags;           // the message tag of each part
  std::vector<int64_t> tokens;     // tokens of member i's block, for every member i
  bool zero_copy = false;          // borrow the blocks where the communicator shares memory
  // kLend, kConsume: own_storage[j] is part j's writable storage (own[j]'s bytes), slot 1.
  KvUse own_use = KvUse::kKeep;
  std::array<void*, kMaxRingParts> own_storage{};
};

// Names of the trace events (static strings).
struct RingTraceNames {
  const char* name;        // "ring": "ring step s", "ring step s transfer", "ring drain"
  const char* category;    // category of the step slices
  const char* tokens_arg;  // the step slice's argument holding the block's token count
};

// The block held at one step: the member it belongs to and its parts (valid during the step).
struct RingBlock {
  int owner = 0;
  std::array<const Tensor*, kMaxRingParts> parts{};
  const Tensor& operator[](size_t i) const { return *parts[i]; }
};

// What the driver spent and held.
struct RingTotals {
  double wait_seconds = 0;      // blocked on the transfers (the drain included)
  double end_sync_seconds = 0;  // the zero-copy drain
  // The receive slots, every part: the storage they occupy, a borrowed block counting as if it
  // had been received into a slot (the K/V a member reads at once, whatever the backend).
  int64_t slot_bytes = 0;
  // The receive slots' storage actually allocated (0 when every block was borrowed). Slot 1 in
  // the own storage (kLend, kConsume) counts in neither figure.
  int64_t allocated_bytes = 0;
};

// The caller's step 2: compute on `block`; progress() tests the step's transfers (for
// AttnParams::progress; from the calling thread only).
using RingStepFn =
    std::function<void(const RingBlock& block, const std::function<void()>& progress)>;

// Runs the N steps above over comm, calling step() once per step with the held block.
RingTotals ring_pass(Communicator& comm, const RingPayload& payload, const RingTraceNames& names,
                     const RingStepFn& step);

// Transfers of a ring of n members: N-1, or N when the own block comes home (KvUse::kLend). The
// driver's steps and the schedules' (add_ring) both count them here.
int ring_transfers(int n, KvUse own_use);

}  // namespace seqpar
