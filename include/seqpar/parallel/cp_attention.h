// The one entry point of context-parallel attention: one call takes the vocabulary (a
// ParallelConfig and an AttnShape), the rank's communicators, where the tokens live (a Placement)
// and this rank's tensors; it validates, derives the strategies' options once, dispatches through
// the strategy table (strategy and schedule; joint text+image attention when the shape has text
// tokens) and writes into the caller's outputs. The runner (`seqpar run`), the models (prefill,
// decode and chunked prefill), the Python module and the planner's measurements all call it.
//
//   place_call(config, shape)         -> the Placement the configuration gives the shape
//   attention(config, shape, comms, place, in, out)
//
// Shapes on sequence-parallel rank r (H, Hkv: the heads the group sees, after tensor parallelism):
//   in.q (B, |q_pos(r)|, H, D), in.k / in.v (B, |kv_pos(r)|, Hkv, D), q, k, v of one dtype;
//   joint attention (shape.text_tokens = T): in.text_q (B, T, H, D), in.text_k / text_v
//   (B, T, Hkv, D), the same on every rank;
//   out.out (B, |q_pos(r)|, H, D) in shape.out_dtype (fp32, or the inputs' dtype: the fp32 result
//   rounded once) and out.lse (B, |q_pos(r)|, H) fp32 (natural log), left empty without
//   shape.lse; with text, out.text_out (B, T, H, D) and out.text_lse (B, T, H) likewise, the same
//   on every rank;
//   with shape.text_by_heads the text's q, k, v and outputs hold this rank's Ulysses heads only
//   (ulysses_q_heads / ulysses_kv_heads of its Ulysses rank, strategies.h).
// Inputs are views (core/tensor_view.h; a Tensor converts): any strides, e.g. rows of a larger
// tensor, head slices of a fused projection or PyTorch's (B, H, S, D) memory. The sequence
// strategies read them where they lie (q always; k and v are packed once where they travel as
// blocks and are not dense), joint attention with the text on every rank too; the cache
// strategies and the text split by head get a strided view packed once. Outputs the caller
// leaves empty are allocated; those it gives (a Tensor, or a view of its memory with any strides)
// must have these shapes and dtypes and are written in place.
// Thread-safety: one call per rank thread; the ranks of the group make the same call together.
#pragma once

#include <cstdint>

#include "seqpar/core/tensor.h"
#include "seqpar/core/tensor_view.h"
#include "seqpar/parallel/config.h"
#include "seqpar/parallel/partition.h"
#include "seqpar/parallel/strategies.h"

namespace seqpar {

// The placement config c (degrees filled) gives shape s: over a sequence sequence_partition (the
// padded sequence when c.pad), over a cache decode_placement (one request, or cached_lens and
// fresh_lens).
Placement place_call(const ParallelConfig& c, const AttnShape& s);

// The strategies' options for c and s on place: causal, the Ulysses mode, the softmax, the
// schedule, the padding mask (valid_len = s.seq when the placement's sequence is longer) and the
// documents (cu_seqlens); scale and block sizes from `kernel`.
struct KernelOptions {
  float scale = 0.f;  // 0: 1/sqrt(head_dim)
  int block_q = 0;    // the kernel's tiles, 0: its choice
  int block_k = 0;
};
CpOptions cp_options(const ParallelConfig& c, const AttnShape& s, const Placement& place,
                     const KernelOptions& kernel = {});

// The caller's tensors, borrowed for the call.
struct AttnInputs {
  TensorView q, k, v;
  TensorView text_q = {}, text_k = {}, text_v = {};  // joint attention only (else no shape)
  // What the rings may do with k and v where blocks are copied is the shape's kv_use
  // (AttnShape::kv_use: kLend writes them during the call and returns them as given, K/V memory 2
  // shards instead of 3 and one more block each way; kConsume leaves them holding another rank's
  // block, as kLend with joint attention, which reads them again), so that the schedules
  // (attention_schedule) predict what the call does.
};
struct AttnOutputs {
  Tensor out, lse;
  Tensor text_out, text_lse;  // joint attention only
  // Where given (a shape), the output is written into the caller's memory there instead, and the
  // Tensor above stays empty: out views in shape.out_dtype with a contiguous head_dim, lse views
  // fp32.
  MutableTensorView out_into, lse_into, text_out_into, text_lse_into;
};

// Attention of this rank's queries over the whole sequence (or cache) as config c runs shape s.
// c's degrees must be filled (fill_sp_degrees) and match comms (ulysses_degree, the group's
// size); s is the group's view (heads after tp). InvalidArgument (one line) for a configuration,
// shape, placement or tensor that does not fit; communication errors propagate as CommError.
void attention(const ParallelConfig& c, const AttnShape& s, SpComms& comms, const Placement& place,
               const AttnInputs& in, AttnOutputs& out, CpStats* stats = nullptr,
               const KernelOptions& kernel = {});

}  // namespace seqpar
