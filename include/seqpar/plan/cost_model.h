// The cost model: for one mesh (cfg x tp x ring x ulysses ranks, a strategy, a layout) and one
// workload (a model's shapes at a sequence length, or one bare attention call), what every rank
// of the sequence-parallel group computes, sends, receives and holds per layer, and how long a
// layer and a step take on a hardware profile.
//
//   schedule: what every rank does in the attention call (parallel/schedule.h): its steps, the
//            bytes CommStats counts, the work CpStats counts, its K/V memory (CpStats, exactly);
//            FLOPs = 4·D per score element, plus the linear layers' 2·MACs (approximate).
//   memory:  that K/V, weights / tp, a KV cache (llm), and an estimate of one layer's
//            activations.
//   time:    the schedule replayed on hardware.h's two-level alpha-beta network (ring steps
//            overlap transfer and compute as far as the profile's `overlap` says; collectives
//            wait for their slowest member), then the linear layers and tp's all-reduce, times
//            the layers. The model knows no strategy: a strategy with a schedule is costed.
// Thread-safety: pure functions of values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "seqpar/core/dtype.h"
#include "seqpar/model/presets.h"
#include "seqpar/parallel/config.h"
#include "seqpar/parallel/decode.h"
#include "seqpar/parallel/position_runs.h"
#include "seqpar/parallel/strategies.h"
#include "seqpar/plan/hardware.h"

namespace seqpar {

// What runs: one model forward step (a denoising step, a prefill, a partial prefill / decode
// step over a cache), or one bare attention call (attention_only, the shape of `seqpar run`).
struct Workload {
  std::string model = "attention";  // preset name, or "attention"
  ModelFamily family = ModelFamily::kLlm;
  bool attention_only = true;  // no linear layers, no weights, one layer
  int64_t seq = 0;             // sharded tokens S (video/image tokens, prompt, or P + T)
  int64_t text_tokens = 0;     // joint attention (mmdit): T text tokens replicated on every rank
  int64_t cross_tokens = 0;    // cross-attention (dit): replicated encoder tokens
  int64_t batch = 1;
  int cfg_branches = 1;  // 2 with classifier-free guidance
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  int64_t hidden = 0, ffn_dim = 0, layers = 1, params = 0;
  bool causal = false;
  DType dtype = DType::kBF16;
  int64_t cached = 0, fresh = 0;  // decode / partial prefill: P cached and T new tokens
  bool decode() const { return fresh > 0; }
};

// Throws InvalidArgument unless every size is within core/limits.h and the products the cost
// model forms (score elements, activation bytes) fit int64 with room: checked without overflow.
// model_workload and attention_workload call it.
void check_workload_limits(const Workload& w);

// A model's workload at `tokens` sharded tokens (dit/mmdit: latent patches; llm: the prompt).
// With fresh > 0 (llm only) the step is T = fresh new tokens over a cache of `cached`.
Workload model_workload(const ModelPreset& m, int64_t tokens, int64_t batch, DType dtype,
                        bool guidance, int64_t text_tokens, int64_t cached = 0, int64_t fresh = 0);
// One attention call of seqpar run's shape.
Workload attention_workload(int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim,
                            int64_t batch, bool causal, DType dtype, int64_t text_tokens = 0,
                            int64_t cached = 0, int64_t fresh = 0);

// One collective (or the ring's point-to-point steps) of a rank, per layer.
struct CollectiveCost {
  std::string op;               // all_gatherv, all_to_allv, send_recv, all_gather, all_reduce
  std::string what;             // "k", "v", "q", "out+lse", "token counts", "text partials", ...
  std::string group;            // sp, ulysses, ring, tp
  uint64_t sent = 0, recv = 0;  // bytes as CommStats counts them
  int64_t calls = 0;            // ops per layer
  bool inter_node = false;      // the group spans nodes
  bool overlapped = false;      // may hide behind compute (ring steps)
  double seconds = 0;           // alpha-beta time per layer
};

// One rank of the sequence-parallel group (the same in every cfg and tp group), per layer.
struct RankCost {
  int64_t tokens = 0;           // its queries (sharded tokens, padding included)
  int64_t work = 0;             // visible score elements (CpStats::work; joint: its text too)
  uint64_t sent = 0, recv = 0;  // attention bytes (CommStats): the schedule's
  int64_t peak_kv_bytes = 0;    // K/V held at once (CpStats::peak_kv_bytes)
  double attention_flops = 0;   // all attention of the layer (self, cross, text)
  double linear_flops = 0;
  double compute_s = 0;  // compute time of the layer (attention, linear, local copies)
  double finish_s = 0;   // when its layer ends in the replay
};

struct MeshCost {
  ParallelConfig config;
  int64_t seq = 0, padded_seq = 0, remainder = 0;  // remainder: seq mod sp
  std::vector<RankCost> ranks;                     // sp ranks
  std::vector<CollectiveCost> collectives;         // of the critical rank
  int critical_rank = 0;                           // the rank that finishes last
  double compute_s = 0, comm_s = 0, exposed_comm_s = 0, layer_s = 0, step_s = 0;
  double work_imbalance = 1;  // max / mean attention work computed (replicated work included)
  uint64_t tp_bytes = 0;      // all-reduce bytes per rank per layer (CommStats rule n·(tp-1))
  // Memory per rank.
  double weight_bytes = 0, kv_cache_bytes = 0, activation_bytes = 0, memory_bytes = 0;
  double memory_limit = 0;
  bool fits_memory = true;
};

// The rank placement for the profile: ranks sharing a node with rank 0.
int ranks_on_node(const HardwareProfile& hw, int world);
// Node of world rank w.
int node_of(const HardwareProfile& hw, int world_rank);

// The attention shape of a workload (batch x guidance branches, every head; the cache when it
// decodes): validate_config's shape. The cost model divides batch by cfg and heads by tp. What
// the call keeps: a model's blocks the output in the workload's dtype and no lse, a bare
// attention call (attention_only) fp32 output and lse, as `seqpar run`. What it gives up of its k
// and v (AttnShape::kv_use): a model's self-attention over a sequence its fresh k and v
// (kConsume), joint blocks and a cache nothing (kKeep); a bare call nothing here, and on profile
// hw (the second form, the cost model's) what `seqpar run` lends where blocks are copied
// (runner_kv_use: every profile but a shared node's threads).
AttnShape workload_shape(const Workload& w);
AttnShape workload_shape(const Workload& w, const HardwareProfile& hw);

// The checks of cfg and tp alone (guidance branches, a bare call's tp, and validate_config's
// checks of the heads and kv heads they split). Throws InvalidArgument with the reason.
void check_mesh_degrees(const Workload& w, int cfg, int tp);

// Costs one mesh. Throws InvalidArgument with the reason when the mesh cannot run the workload
// (degrees that do not multiply or divide, strict shapes, more sp ranks than tokens, ...).
// memory_limit 0: the profile's per-rank memory.
MeshCost cost_mesh(const Workload& w, const ParallelConfig& m, const HardwareProfile& hw,
                   double memory_limit = 0);

// The All2All-aware variant of Meta's rule (see docs/planner.md): pass-KV if
//   T >= N·C·Hkv·e / (2·H·BW)   or   T/(T+P) >= 2·Hkv/H - 4·T·BW / (N·C·e),
// else pass-Q: the second test adds the exposed all-to-all of pass-Q's partial outputs.
PassChoice choose_pass_all2all(int64_t new_tokens, int64_t cached_tokens, int ranks, int64_t heads,
                               int64_t kv_heads, size_t elem_bytes, double flops_per_s,
                               double bytes_per_s);

}  // namespace seqpar
