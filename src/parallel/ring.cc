// ring (pass-KV; docs/algorithms.md "ring (pass-KV)"): K/V blocks travel around the ring while
// each member attends its queries to the block it holds, folding each block into its state.
// ring_over_blocks is the core of ring_attention, passkv (decode.cc), schedule steal (steal.cc,
// more queries on each held block) and usp's ring part (ulysses.cc); the rotation, its double
// buffering and the zero-copy borrowing are the ring driver's (ring_driver.h).
//
// Accepts: member i of the ring holds the K/V of the tokens at block_pos[i] (any order, any
//   lengths: every layout, uneven and padded shards, documents); this member's q (B, Sq, H, D)
//   at q_pos and k, v (B, n_r, Hkv, D) at block_pos[r], fp32, bf16 or fp16, H a multiple of Hkv;
//   CpOptions: causal, padding (valid_len), documents (cu_seqlens), softmax online or const-max,
//   kv_use (kKeep; kLend, kConsume: k and v are written during the call, contiguous storage of
//   their own that no other thread reads meanwhile).
// Returns: the state of q over every member's keys, out (B, Sq, H, D) and lse (B, Sq, H), fp32;
//   adds to *stats (ring_attention resets it first).
// Steps on member r of N (next = r+1, prev = r-1 mod N); at step s it holds the block of r-s:
//   (const-max: all_reduce(max) of the largest key norm per (batch, kv head), const_max.cc)
//   1. if s < N-1 (opts.kv_use kLend: s < N, the last receiving the own block back): irecv(prev)
//      of the block of member r-s-1, isend(next) of the held block
//   2. attend q to the held block unless the mask hides all of it, folded by the kernel into
//      the state of the blocks before (AttnParams::accumulate)
//      (const-max: the first block attended decides each row fixed or fallback; later blocks
//      add the fixed rows' sums without rescaling)
//   3. wait; the received block becomes the held one
// Blocks held (member i holds the block of member i-s), N = 4:
//   step   member 0   member 1   member 2   member 3
//   0      0          1          2          3
//   1      3          0          1          2
//   2      2          3          0          1
//   3      1          2          3          0
// Bytes per member (t = 2·B·Hkv·D·e, a token's K and V; n_i tokens of member i, S = Σ n_i):
//   sent t·(S - n_{r+1}), received t·(S - n_r), in N-1 messages of K and N-1 of V, each
//   overlapped with a step's attention; even shards 2·S·Hkv·D·e·B·(N-1)/N each way. kLend: t·S
//   each way, N messages of each (the own block home). const-max adds 4·B·Hkv·(N-1) each way.
// Memory: the own shard plus two receive slots, each as large as the largest block it received
//   (CpStats::peak_kv_bytes): 3/N of the K/V on even shards. kLend, kConsume: the own shard's
//   storage is slot 1, so 2/N (unless a block received into it is larger than the own shard:
//   then two slots as kKeep). Zero copy (threads backend): no slot is allocated and k, v are
//   never written, peers' blocks are read in place (measured_kv_bytes: the own shard).
// Where the own block goes (copies): kKeep never sends it away for good (its storage is read
//   only); kLend lends its storage and brings the block home at step N-1 (k, v as given on
//   return); kConsume leaves k, v holding another member's block (callers that read them no
//   more). ring_driver.h has the slot each block lands in.
// Limitations: causal masking skips compute, not bytes (every block travels: members further on
//   need it); contiguous causal shards leave rank r about (2r+1)/N of the mean work (use zigzag,
//   striped or schedule steal); the N-1 transfers are in series, so a step too short to hide
//   its transfer exposes it.
#include <array>
#include <memory>
#include <optional>
#include <vector>

#include "ring_driver.h"
#include "schedule_build.h"
#include "seqpar/core/timer.h"
#include "strategy_common.h"

namespace seqpar {

namespace {

constexpr int kTagK = 101;
constexpr int kTagV = 102;
constexpr RingTraceNames kTraceNames{"ring", "ring", "keys"};

// The state of this member's queries q (B, Sq, H, D) at q_pos over the K/V blocks attended so
// far: the first attended block's state, the later ones folded into it by the kernel
// (AttnParams::accumulate), or with the const-max softmax the ConstMaxAccumulator. work: the
// visible score elements computed.
class BlockAttention {
 public:
  BlockAttention(const TensorView& q, std::span<const int64_t> q_pos, const CpOptions& opts,
                 std::optional<ConstMaxAccumulator> cmax)
      : q_(q), q_pos_(q_pos), opts_(opts), cmax_(std::move(cmax)) {}

  // Attends q to the block (k, v) (B, n, Hkv, D) at k_pos unless the mask hides all of it, and
  // folds it into the state. Returns whether it computed.
  bool attend(const Tensor& k, const Tensor& v, std::span<const int64_t> k_pos,
              const std::function<void()>& progress) {
    if (fully_hidden(opts_, q_pos_, k_pos)) return false;
    const int64_t B = q_.dim(0);
    KernelCall call(opts_, q_pos_, k_pos, B);
    AttnParams& params = call.params;
    params.progress = progress;
    if (cmax_) {
      if (cmax_->started()) cmax_->prepare(params);
      AttnState part = flash_attention(q_, k, v, params);
      if (cmax_->started()) {
        cmax_->add(part);
      } else {
        cmax_->start(std::move(part));
      }
    } else if (first_) {
      acc_ = flash_attention(q_, k, v, params);
      first_ = false;
    } else {  // folded into the state by the kernel: no second state, no merge pass
      flash_attention_fold(acc_, q_, k, v, params);
    }
    work_ += visible_score_elements(B, q_.dim(2), q_.dim(1), k.dim(1), params.mask);
    return true;
  }

  // The state over every block attended (empty if none); const-max: its fallback rows.
  AttnState finish(int64_t* fallback_rows) {
    if (cmax_ && cmax_->started()) {
      *fallback_rows = cmax_->fallback_rows();
      return cmax_->finish();
    }
    *fallback_rows = 0;
    if (first_) return AttnState::empty(q_.dim(0), q_.dim(1), q_.dim(2), q_.dim(3));
    return std::move(acc_);
  }

  int64_t work() const { return work_; }

 private:
  TensorView q_;  // read by the kernel where it lies
  std::span<const int64_t> q_pos_;
  const CpOptions& opts_;
  std::optional<ConstMaxAccumulator> cmax_;
  AttnState acc_;
  bool first_ = true;
  int64_t work_ = 0;
};

}  // namespace

AttnState ring_over_blocks(Communicator& comm, std::span<const std::span<const int64_t>> block_pos,
                           std::span<const int64_t> q_pos, const TensorView& q, const Tensor& k,
                           const Tensor& v, const CpOptions& opts, CpStats* stats,
                           const RingBlockHook& on_block) {
  const int n = comm.size(), r = comm.rank();
  SEQPAR_CHECK(static_cast<int>(block_pos.size()) == n, "one block per ring member");
  SEQPAR_CHECK(k.dim(1) == static_cast<int64_t>(block_pos[r].size()), "own block size");
  double compute = 0, bounds_wait = 0;

  // const-max: the row bounds from the all-reduced key norms, before step 0.
  std::optional<ConstMaxAccumulator> cmax;
  if (opts.softmax == SoftmaxMode::kConstMax) {
    const double t = now_seconds();
    cmax.emplace(const_max_row_bounds(comm, q, k, block_pos[r], opts));
    bounds_wait = now_seconds() - t;
  }
  BlockAttention attention(q, q_pos, opts, std::move(cmax));

  // The ring of K/V blocks; each step attends q (then the hook's queries) to the held block.
  // kLend, kConsume: the caller gave up k and v for the call (CpOptions::kv_use), so their
  // storage is written.
  RingPayload payload{{&k, &v}, {kTagK, kTagV}, {}, /*zero_copy=*/true, opts.kv_use};
  if (opts.kv_use != KvUse::kKeep)
    payload.own_storage = {const_cast<void*>(k.raw()), const_cast<void*>(v.raw())};
  for (const auto& pos : block_pos) payload.tokens.push_back(static_cast<int64_t>(pos.size()));
  auto attend_block = [&](const RingBlock& block, const std::function<void()>& progress) {
    const double t0 = now_seconds();
    if (attention.attend(block[0], block[1], block_pos[block.owner], progress))
      compute += now_seconds() - t0;
    if (on_block) on_block(block.owner, block[0], block[1], progress);
  };
  const RingTotals ring = ring_pass(comm, payload, kTraceNames, attend_block);

  int64_t fallback = 0;
  const double t = now_seconds();
  AttnState acc = attention.finish(&fallback);
  compute += now_seconds() - t;
  if (stats) {
    const int64_t own = static_cast<int64_t>(k.nbytes() + v.nbytes());
    stats->fallback_rows += fallback;
    stats->peak_kv_bytes = std::max(stats->peak_kv_bytes, own + ring.slot_bytes);
    // Storage actually allocated: the receive slots (none when every block was borrowed).
    stats->measured_kv_bytes = std::max(stats->measured_kv_bytes, own + ring.allocated_bytes);
    stats->work += attention.work();
    stats->compute_seconds += compute;
    stats->wait_seconds += bounds_wait + ring.wait_seconds;
    stats->end_sync_seconds += ring.end_sync_seconds;
  }
  return acc;
}

AttnState ring_attention(Communicator& comm, const Partition& part, const TensorView& q,
                         const TensorView& k, const TensorView& v, const CpOptions& opts,
                         CpStats* stats) {
  validate_local_shapes(comm, part, q, k, v);
  std::vector<std::span<const int64_t>> blocks(part.ranks());
  for (int i = 0; i < part.ranks(); ++i) blocks[i] = part.positions(i);
  if (stats) *stats = CpStats{};
  // q is read where it lies; k and v travel as blocks: dense as given, else packed once.
  return ring_over_blocks(comm, blocks, part.positions(comm.rank()), q, k.contiguous(),
                          v.contiguous(), opts, stats);
}

// ---- schedule -------------------------------------------------------------------------------

namespace {

// Tensor's capacity rule: 64-byte multiples, at least 64 (0 for nothing).
int64_t capacity_bytes(int64_t bytes) {
  return bytes <= 0 ? 0 : std::max<int64_t>(64, (bytes + 63) / 64 * 64);
}

// What ring_over_blocks holds on member r: its own block plus two receive buffers (K and V
// each), buffer i refilled at the transfer steps s = i (mod 2), growing to the largest block it
// received; with kLend or kConsume buffer 1 is the own block's storage unless a block it
// receives is larger than the own. len[i]: tokens of block i; token_bytes: K or V of one token.
int64_t ring_peak_kv(std::span<const int64_t> len, int r, int64_t token_bytes, KvUse use) {
  const int n = static_cast<int>(len.size());
  int64_t buf[2] = {0, 0};
  bool own_slot = use != KvUse::kKeep && n > 1;
  for (int s = 0; s < ring_transfers(n, use); ++s) {
    const int incoming = ((r - s - 1) % n + n) % n;
    buf[s % 2] = std::max(buf[s % 2], len[incoming] * token_bytes);
    if (s % 2 == 1 && len[incoming] > len[r]) own_slot = false;
  }
  return 2 * len[r] * token_bytes +
         2 * (capacity_bytes(buf[0]) + (own_slot ? 0 : capacity_bytes(buf[1])));
}

}  // namespace

// Member i at step s (0 <= s < n) attends to the block of member i - s and, for s < n-1 (kLend:
// s < n, the last bringing the own block home), sends the block it holds to member i+1 while
// receiving that of member i-s-1 from member i-1. A step after the first attended block folds
// into the accumulator (the kernel reads it once).
void add_ring(Schedule& s, const CallRuns& c, GroupMembers members,
              std::span<const PositionRuns> blocks, std::span<const PositionRuns> queries,
              int64_t heads, int64_t kv_heads, CommGroup group, SoftmaxMode softmax) {
  const KvUse kv_use = c.kv_use;
  const int n = static_cast<int>(members.size());
  const int64_t token = c.B * kv_heads * c.D * static_cast<int64_t>(c.e);  // K or V of a token
  std::vector<int64_t> len(n);
  for (int i = 0; i < n; ++i) len[i] = run_count(blocks[i]);
  for (int i = 0; i < n; ++i) {
    RankSchedule& rs = s.ranks[members[i]];
    if (softmax == SoftmaxMode::kConstMax && n > 1)
      rs.steps.push_back(key_norms_step(c, members, kv_heads, group));
    const int64_t rows = run_count(queries[i]);
    bool attended = false;
    for (int step = 0; step < n; ++step) {
      const int src = ((i - step) % n + n) % n;
      Step st;
      if (!c.hidden(queries[i], blocks[src])) {
        st.work = c.B * heads * c.visible(queries[i], blocks[src]);
        if (attended) st.copy_bytes = c.fold_bytes(rows, heads);
        attended = true;
      }
      if (step < ring_transfers(n, kv_use)) {
        Transfer& t = st.comm.emplace();
        t.op = OpKind::kSendRecv;
        t.what = "k, v";
        t.group = group;
        t.members = members;
        t.sent = 2 * token * len[src];
        t.recv = 2 * token * len[((i - step - 1) % n + n) % n];
        t.calls = 2;
        t.overlaps_compute = true;
      }
      rs.steps.push_back(std::move(st));
    }
    rs.peak_kv_bytes = ring_peak_kv(len, i, token, kv_use);
  }
}

Schedule ring_schedule(const ParallelConfig& cfg, const AttnShape& shape) {
  const CallRuns c = sequence_runs(cfg, shape);
  Schedule s = empty_schedule(c);
  add_ring(s, c, consecutive_members(0, c.n()), c.kv, c.q, c.H, c.Hkv, CommGroup::kSp, cfg.softmax);
  return s;
}

}  // namespace seqpar
