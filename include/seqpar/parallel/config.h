// The one vocabulary of a parallel layout, used by the strategies, the planner, the models, the
// command line, the Python module and the tests:
//   Strategy        how the sequence-parallel group computes attention;
//   UlyssesMode, SoftmaxMode, Layout (partition.h): the options that change what a strategy does;
//   MeshShape       the degrees: world = cfg x tp x ring x ulysses (mesh.h places the ranks);
//   ParallelConfig  all of the above: one parallel layout;
//   AttnShape       one attention call's shape (a sharded sequence, or new tokens over a cache);
// one table of the names users type for each value, one padding rule, the degree defaults, and
// one validation. Messages name values as the API does (strategy, ulysses_degree, ring_degree,
// seq, heads, kv_heads, text_tokens, cached, new, ...); the command line maps them to its flags.
// Thread-safety: pure functions of values.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "seqpar/core/dtype.h"
#include "seqpar/parallel/partition.h"

namespace seqpar {

// local:     one sequence-parallel rank, no communication.
// allgather: K and V all-gathered, local attention over the whole sequence.
// ring:      K/V blocks passed around the ring (pass-KV over a sharded sequence).
// ulysses:   all-to-all sequence -> heads, full-sequence attention on a share of the heads.
// usp:       ulysses inside groups, ring across them.
// passkv:    new tokens over a distributed K/V cache, the K/V shards passed around the ring.
// passq:     new tokens over a distributed K/V cache, the queries passed to the K/V.
enum class Strategy { kLocal, kAllGather, kRing, kUlysses, kUsp, kPassKv, kPassQ };
std::string_view strategy_name(Strategy s);      // the canonical names above
// Canonical or alias; InvalidArgument "<parameter> 'x' is unknown; valid: ..." (default
// parameter: "strategy").
Strategy parse_strategy(std::string_view name, std::string_view parameter = {});
std::span<const Strategy> all_strategies();
// What each strategy accepts and does (over a cache or a sequence, its ring, its degrees, its
// schedules): strategy_table.h.

// strict: sequence and heads must divide the Ulysses degree; uaa: any length (variable
// all-to-all) and any head count (heads padded to the next multiple of the degree; padded head
// slots are neither sent nor computed).
enum class UlyssesMode { kStrict, kUaa };
std::string_view ulysses_mode_name(UlyssesMode m);
UlyssesMode parse_ulysses_mode(std::string_view name);

// How ring steps combine their partial states (docs/algorithms.md "const-max ring").
//   online:    every step's state is merged by LSE (flash attention's online softmax).
//   const-max: every query row gets a fixed maximum, a bound on its logits from all-reduced key
//              norms (scale·|q|·max|k|, Cauchy–Schwarz); the kernel uses it for every block, so
//              the steps' unnormalized sums add without rescaling, in any order. Rows whose
//              bound is too loose (more than 30 above the log-sum-exp of the first block they
//              attend) fall back to the online merge. Rings only: ring and usp's ring part.
enum class SoftmaxMode { kOnline, kConstMax };
std::string_view softmax_mode_name(SoftmaxMode m);      // "online", "const-max"
SoftmaxMode parse_softmax_mode(std::string_view name);  // InvalidArgument lists names

// Which of its schedules a strategy runs (docs/algorithms.md), where it has more than one:
//   default: its own (ring: each rank attends its own queries while K/V blocks pass; passq: the
//            queries all-gathered);
//   steal:   ring, causal, contiguous shards: the ranks holding late tokens hand part of their
//            queries' work to the ranks holding early ones, which return partial states that the
//            owners merge by LSE, so that every rank computes the same visible score elements
//            (DistFlashAttn's balance, without moving tokens);
//   ring:    passq: Q blocks pass around the ring, overlapped with attention on the local K/V, and
//            the partial states return to their owners in one all-to-all.
enum class ScheduleKind { kDefault, kSteal, kRing };
std::string_view schedule_kind_name(ScheduleKind k);      // "default", "steal", "ring"
ScheduleKind parse_schedule_kind(std::string_view name,   // InvalidArgument lists names
                                 std::string_view parameter = {});

// The names a value may be given by besides its canonical one (what peers and users type), for
// help texts: "strategy", "layout", "ulysses_mode", "softmax" -> (alias, canonical) pairs.
struct NameAlias {
  std::string_view kind, alias, name;
};
std::span<const NameAlias> name_aliases();

// The degrees of a mesh, outermost first (names as vLLM-Omni and xDiT: cfg_parallel_size,
// tensor_parallel_size, ring_degree, ulysses_degree).
struct MeshShape {
  int cfg = 1;      // cfg_parallel_size: guidance branches (1 or 2 in practice)
  int tp = 1;       // tensor_parallel_size
  int ring = 1;     // ring_degree
  int ulysses = 1;  // ulysses_degree
  int sp() const { return ring * ulysses; }  // sequence_parallel_size
  int world() const { return cfg * tp * ring * ulysses; }
  bool operator==(const MeshShape&) const = default;
};
// "cfg 1 x tp 4 x ring 8 x ulysses 1"
std::string mesh_shape_text(const MeshShape& shape);

// One parallel layout.
struct ParallelConfig {
  MeshShape mesh;
  Strategy strategy = Strategy::kRing;
  Layout layout = Layout::kContiguous;
  UlyssesMode ulysses_mode = UlyssesMode::kUaa;  // ulysses and usp
  SoftmaxMode softmax = SoftmaxMode::kOnline;    // ring and usp
  ScheduleKind schedule = ScheduleKind::kDefault;  // steal: ring; ring: passq
  bool pad = false;  // pad the sequence to padded_seq() and mask the padding
  int sp() const { return mesh.sp(); }
  int world() const { return mesh.world(); }
  bool operator==(const ParallelConfig&) const = default;
};
// "cfg 2 tp 1 ulysses 4 ring 1 ulysses(uaa) contiguous", with " padded", " const-max",
// " steal" (a schedule kind other than default) when set.
std::string config_label(const ParallelConfig& c);

// What a ring (ring, passkv, steal, usp's ring part) may do with this member's own K/V (k, v)
// where blocks are copied (MPI; the threads backend reads peers' blocks in place and writes
// nothing): kKeep reads them only and receives into two buffers of its own (own shard + two
// blocks); kLend lends their storage as one of the two buffers and brings the own block home by
// one more transfer (own shard + one block; k and v hold their values again on return, but not
// during the call or after an error); kConsume lends it without bringing it home (k and v hold
// some member's block on return). docs/algorithms.md "ring (pass-KV)".
enum class KvUse { kKeep, kLend, kConsume };

// One attention call: B sequences of `seq` sharded tokens (over a cache: seq = cached + fresh),
// H query heads and Hkv key/value heads of D dimensions (kv_heads 0: heads), and T replicated text
// tokens of joint attention.
// Packed sequences (varlen): seq_lens, the lengths of the documents packed into the sequence in
// order (sum = seq; empty: one document); a token attends only keys of its own document (and
// causal on global positions). Over a cache, a batch of requests packed one after another:
// request i is cached_lens[i] cached tokens then fresh_lens[i] new ones, a document each
// (cached = sum cached_lens, fresh = sum fresh_lens; empty: one request).
struct AttnShape {
  int64_t batch = 1;
  int64_t seq = 0;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  bool causal = false;
  int64_t text_tokens = 0;
  int64_t cached = 0, fresh = 0;  // over a K/V cache: P cached tokens and T new ones
  DType dtype = DType::kF32;
  std::vector<int64_t> seq_lens{};                  // packed documents (varlen)
  std::vector<int64_t> cached_lens{}, fresh_lens{};  // packed requests over a cache
  // Joint attention with the text split by head over the Ulysses group (ulysses, usp): each
  // member's text q/k/v and text output hold its Ulysses heads only (ulysses_joint_attention).
  bool text_by_heads = false;
  // What the call returns: the output in fp32 or in dtype (out_dtype; the fp32 result rounded
  // once, to nearest even), and the log-sum-exp (fp32) or not (lse). Ulysses sends back only
  // these, so a bf16 output without the log-sum-exp halves its second exchange.
  DType out_dtype = DType::kF32;
  bool lse = true;
  // What the caller gives up: its k and v (KvUse above; kKeep, kLend, kConsume). The ring reads
  // it where blocks are copied, and the schedules predict its transfers and peak K/V from it.
  KvUse kv_use = KvUse::kKeep;
  int64_t kv() const { return kv_heads == 0 ? heads : kv_heads; }
  bool over_cache() const { return cached > 0 || fresh > 0; }
  bool operator==(const AttnShape&) const = default;
};

// The documents of s as cu_seqlens (partition.h): seq_lens' prefix sums over a sequence, each
// request's cached + new tokens over a cache; empty when s has one document.
std::vector<int64_t> shape_cu_seqlens(const AttnShape& s);

// The padding rule: with pad, a sequence of `seq` tokens over `sp` ranks is padded to the next
// multiple of sp (of 2·sp for zigzag, whose 2·sp chunks are then equal); the padding keys are
// masked (CpOptions::valid_len = seq) and the padded queries' outputs dropped.
int64_t pad_multiple(int sp, Layout layout);
int64_t padded_seq(int64_t seq, int sp, Layout layout);
// The sharded length config c runs shape s at: padded_seq when c.pad, else s.seq.
int64_t sharded_seq(const ParallelConfig& c, const AttnShape& s);

// The partition config c runs the sequence of shape s with: Partition(sharded_seq, sp, layout),
// or with seq_lens and a zigzag or striped layout Partition::documents (each document split on
// its own; the padding after the last document). Contiguous stays contiguous over the packed
// sequence.
Partition sequence_partition(const ParallelConfig& c, const AttnShape& s);

// The checks of c and s that hold whatever the strategy: degrees in range (each >= 1, the world
// within limits::kMaxRanks), the shape (sizes in range, heads divisible by kv_heads and tp,
// kv_heads splittable by tp, text tokens bidirectional), over a cache the cache (every
// sequence-parallel rank holds a cached token, no pad or text_tokens, cached_lens and fresh_lens
// of one length summing to cached and new), over a sequence the tokens (every sequence-parallel
// rank holds a real token, seq_lens summing to seq, each >= 1, no text_tokens with documents).
// InvalidArgument with one line naming what was wrong and what would be valid. validate_config
// (strategy_table.h) adds the strategy's checks.
void check_config_fields(const ParallelConfig& c, const AttnShape& s);

}  // namespace seqpar
