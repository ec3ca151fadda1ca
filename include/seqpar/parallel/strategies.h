// Context-parallel attention: each rank holds the queries, keys and values of its tokens (a
// Partition of the sequence) and gets the attention of its queries over the whole sequence.
// Strategies compose attention/ (local kernel, merge) with comm/ (the Communicator).
//
// Shapes on rank r (n_r = part.count(r) tokens at global positions part.positions(r)):
//   q (B, n_r, H, D)   k, v (B, n_r, Hkv, D)   -> AttnState{out (B, n_r, H, D), lse (B, n_r, H)}
// The sequence strategies take views of any strides (core/tensor_view.h): q is read where it lies,
// k and v packed once where they travel as blocks and are not dense (ring, allgather, steal).
// Costs per rank (e = element bytes; docs/algorithms.md):
//   allgather: K and V gathered in one bulk op each; sent 2·B·n_r·Hkv·D·e·(N-1),
//              received 2·B·(S-n_r)·Hkv·D·e. K/V memory: the full sequence.
//   ring:      N-1 steps; step s passes the block that arrived at step s-1 (own at s=0) to rank
//              r+1 while computing on it; sent 2·B·(S-n_{r+1})·Hkv·D·e, received
//              2·B·(S-n_r)·Hkv·D·e. K/V memory: own shard plus two blocks in flight.
//   ulysses:   all-to-all of q, k, v (sequence -> heads), attention, all-to-all of out and lse
//              (fp32) back; see docs/algorithms.md for the bytes.
// Packed documents (CpOptions::cu_seqlens): every strategy masks pairs across documents in the
// kernel and skips blocks whose documents do not meet; the bytes are those above.
// Each strategy's steps, bytes, work and K/V memory as data: schedule.h. The one entry point that
// dispatches on the configuration: cp_attention.h (through strategy_table.h).
// Thread-safety: one call per rank thread; ranks run the same call concurrently.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "seqpar/attention/attention.h"
#include "seqpar/comm/communicator.h"
#include "seqpar/core/index_range.h"
#include "seqpar/parallel/config.h"
#include "seqpar/parallel/partition.h"

namespace seqpar {

struct CpOptions {
  bool causal = false;
  float scale = 0.f;  // 0 = 1/sqrt(D)
  int block_q = 0;    // kernel block sizes, 0 = the kernel's choice
  int block_k = 0;
  UlyssesMode ulysses_mode = UlyssesMode::kUaa;
  // Padding (auto_pad): keys at positions >= valid_len are padding and masked; 0 = no padding.
  // The outputs of padded queries are computed but meaningless; callers drop them.
  int64_t valid_len = 0;
  SoftmaxMode softmax = SoftmaxMode::kOnline;
  ScheduleKind schedule = ScheduleKind::kDefault;  // ring: steal; passq: ring
  // Packed documents (varlen): cu_seqlens (partition.h) of the documents on global positions; a
  // query attends only keys of its own document. Empty = one document.
  std::vector<int64_t> cu_seqlens;
  KvUse kv_use = KvUse::kKeep;  // the rings' use of the caller's k and v
  // What the caller keeps of the result (AttnShape::out_dtype, lse): ulysses and usp send the
  // output back in out_dtype (the fp32 state rounded once) and the lse only when wanted, and
  // return that (out in out_dtype, lse empty without it); the other strategies return fp32 state.
  DType out_dtype = DType::kF32;
  bool lse = true;
};

// The communicators a strategy runs on: the sequence-parallel group (N ranks) and, for usp, its
// split into Ulysses groups of `ulysses_degree` consecutive ranks and ring groups of the ranks
// with the same Ulysses rank. Constructing it is collective over `sp` (it splits).
// Thread-safety: owned and used by one rank thread.
class SpComms {
 public:
  explicit SpComms(Communicator& sp, int ulysses_degree = 0);  // 0: no split (N for ulysses)
  Communicator& sp() { return sp_; }
  int ulysses_degree() const { return ulysses_degree_; }
  int ring_degree() const { return sp_.size() / ulysses_degree_; }
  Communicator& ulysses();  // the sp group itself when ulysses_degree == N
  Communicator& ring();     // a group of one when ring_degree == 1
  // Sum of the stats of every communicator here (sp, ulysses, ring), and their reset.
  CommStats stats() const;
  void reset_stats();

 private:
  Communicator& sp_;
  int ulysses_degree_;
  std::unique_ptr<Communicator> ulysses_, ring_;
};

// Head ranges of Ulysses member j of n: query heads padded to the next multiple of n, member j
// owning slots [j·ceil(H/n), (j+1)·ceil(H/n)) clipped to H; kv heads are those its query heads
// read (query head h reads kv head h / (H/Hkv)); kv heads are replicated when members share one.
IndexRange ulysses_q_heads(int64_t heads, int n, int j);
IndexRange ulysses_kv_heads(int64_t heads, int64_t kv_heads, int n, int j);
// The kv heads member j's kernel reads: its kv heads when the kernel's GQA rule on local heads
// gives every local query head its kv head, else one per query head (expanded locally; usp's
// ring then carries the expanded heads).
int64_t ulysses_kernel_kv_heads(int64_t heads, int64_t kv_heads, int n, int j);

// What one call did on this rank, besides CommStats.
struct CpStats {
  // K/V bytes held at once (own shard + received blocks), predicted from the blocks a rank
  // reads: a block borrowed from a peer without a copy (the threads backend's zero-copy ring)
  // counts as if it had been received into a buffer of its own.
  int64_t peak_kv_bytes = 0;
  // K/V bytes this rank actually held at once in storage: its own shard plus the capacity of
  // every K/V buffer the call allocated (receive buffers, gathered or resharded K/V). Equals
  // peak_kv_bytes wherever blocks are copied (allgather, ulysses, the ring over MPI); the
  // zero-copy ring allocates nothing, so there it is the own shard (docs/algorithms.md).
  int64_t measured_kv_bytes = 0;
  int64_t work = 0;           // visible score elements computed (B·H·pairs)
  double compute_seconds = 0;  // time inside the local kernel and merges
  double wait_seconds = 0;     // time blocked on communication
  // The part of wait_seconds spent after the last step waiting for peers to be done with this
  // rank's memory (the zero-copy ring's drain: they read its K/V in place); it delays no
  // compute: it is the skew between ranks at the end of the call, which copying backends spend
  // outside the call (in the next collective).
  double end_sync_seconds = 0;
  // const-max softmax: query rows (b, token, head) of this rank that ran with the online
  // softmax after their first block (bound too loose, or exceeded); 0 with online softmax.
  int64_t fallback_rows = 0;
  // What the entry point handed the strategy as q, k and v: the caller's memory, or (joint
  // attention, the cache strategies) the copy it packed a strided input into.
  std::array<const void*, 3> input_addresses{};
};

AttnState allgather_attention(Communicator& comm, const Partition& part, const TensorView& q,
                              const TensorView& k, const TensorView& v, const CpOptions& opts,
                              CpStats* stats = nullptr);

AttnState ring_attention(Communicator& comm, const Partition& part, const TensorView& q,
                         const TensorView& k, const TensorView& v, const CpOptions& opts,
                         CpStats* stats = nullptr);

// ring with schedule steal (docs/algorithms.md "steal"): contiguous shards, causal; the work of
// the ranks that hold late tokens is split so that every rank computes the same visible score
// elements, partial states returned to the owners and merged by LSE. Non-causal: ring_attention.
AttnState steal_attention(Communicator& comm, const Partition& part, const TensorView& q,
                          const TensorView& k, const TensorView& v, const CpOptions& opts,
                          CpStats* stats = nullptr);

// ulysses: all-to-all [B, n_r, H, D] -> [B, S, H/N, D] (sequence to heads), full-sequence
// attention on the local heads, all-to-all back (heads to sequence) of out and lse.
AttnState ulysses_attention(Communicator& comm, const Partition& part, const TensorView& q,
                            const TensorView& k, const TensorView& v, const CpOptions& opts,
                            CpStats* stats = nullptr);

// usp: ulysses inside groups of U consecutive ranks, ring across the R = N/U groups.
AttnState usp_attention(SpComms& comms, const Partition& part, const TensorView& q,
                        const TensorView& k, const TensorView& v, const CpOptions& opts,
                        CpStats* stats = nullptr);

// Joint attention (MMDiT dual stream): the image tokens are sharded by `part`, the T text tokens
// are replicated on every rank (text_q (B, T, H, D), text_k/v (B, T, Hkv, D), the same on every
// rank). Together they form one bidirectional sequence, text after the image (positions
// part.seq() .. part.seq()+T-1). Image queries attend the image keys through `strategy` and the
// text keys locally; text queries attend the local image shard, their partial states are
// all-gathered and merged (every text key and value counted exactly once), then the text keys.
// Returns the image state (B, n_r, H, D) and the text state (B, T, H, D), identical on all ranks.
struct JointState {
  AttnState image;
  AttnState text;
};
JointState joint_attention(Strategy strategy, SpComms& comms, const Partition& part,
                           const TensorView& q, const TensorView& k, const TensorView& v,
                           const TensorView& text_q, const TensorView& text_k,
                           const TensorView& text_v, const CpOptions& opts,
                           CpStats* stats = nullptr);
// What the strategy attending the image keeps for shape s (AttnShape::out_dtype, lse): with the
// text on every rank, joint_attention merges that state afterwards, so fp32 with its lse; else
// what s keeps (with the text split by head the merges come before Ulysses sends back). And what
// its rings do with k and v (AttnShape::kv_use): joint attention reads them again afterwards, so
// kConsume becomes kLend.
AttnShape image_call(const AttnShape& s);

// Joint attention with the text split by head over the Ulysses group (strategies ulysses and usp):
// text_q (B, T, |ulysses_q_heads(H, U, u)|, D) and text_k/v (B, T, |ulysses_kv_heads|, D) hold
// only Ulysses member u's heads of the text, so no member projects or attends another's text
// heads. After the all-to-all each member holds its heads of the image sequence (usp: its ring
// group's): its image queries attend every image key (usp: around the ring) and its text keys;
// its text queries attend those image keys (usp: partials all-gathered over the ring and merged)
// and the text keys. Returns the image state (B, n_r, H, D) and the text state of member u's heads
// (B, T, |q heads|, D), the same on the ring's members. Every text key enters once.
JointState ulysses_joint_attention(Strategy strategy, SpComms& comms, const Partition& part,
                                   const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& text_q, const Tensor& text_k, const Tensor& text_v,
                                   const CpOptions& opts, CpStats* stats = nullptr);

// Throws InvalidArgument (naming the sizes and what would work) if the strategy cannot run this
// shape: strict Ulysses with indivisible sequence or heads, usp degrees that do not multiply to
// the ranks, strict usp ring groups of different lengths.
void check_strategy_shape(Strategy strategy, const Partition& part, int64_t heads,
                          int64_t kv_heads, int ulysses_degree, const CpOptions& opts);

// Bytes this rank is predicted to send and receive in one call, for checking CommStats exactly:
// the sum over the strategy's schedule (schedule.h) for any partition.
struct CommPrediction {
  uint64_t sent = 0;
  uint64_t recv = 0;
};
// heads is the query head count (used by ulysses and usp); ulysses_degree by usp (0 = N);
// text_tokens > 0 adds joint attention's text part; softmax const-max the ring's key norms.
CommPrediction predict_comm_bytes(Strategy strategy, const Partition& part, int rank, int64_t batch,
                                  int64_t heads, int64_t kv_heads, int64_t head_dim,
                                  size_t elem_bytes, int ulysses_degree = 0,
                                  int64_t text_tokens = 0,
                                  SoftmaxMode softmax = SoftmaxMode::kOnline);

// Throws InvalidArgument (one line naming the strategies that support it) if opts.softmax is
// const-max and the strategy has no ring (allgather, ulysses).
void check_softmax_mode(Strategy strategy, const CpOptions& opts);

}  // namespace seqpar
