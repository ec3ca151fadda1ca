// Local attention on one rank (no communication): the blockwise flash-attention kernel and the
// naive reference that every result is checked against.
//
// Shapes (token-major):
//   q (B, Sq, H, D)   k, v (B, Sk, Hkv, D)   -> AttnState{out (B, Sq, H, D), lse (B, Sq, H)}
// q, k and v are views (core/tensor_view.h; a Tensor converts): any strides, so a head slice of
// a wider tensor or PyTorch's (B, H, S, D) memory is read where it lies (the kernel packs its
// blocks anyway; only a head_dim that is not contiguous is packed once first).
// GQA: query head h reads KV head h / (H / Hkv); Hkv must divide H.
// Masks are defined on global token positions (MaskSpec), so every layout uses the same kernel.
// Thread-safety: functions are reentrant; a call uses only its arguments and thread-local caches.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "seqpar/attention/state.h"
#include "seqpar/core/tensor.h"
#include "seqpar/core/tensor_view.h"

namespace seqpar {

// Which (query, key) pairs may attend. All spans are optional (empty = default).
struct MaskSpec {
  bool causal = false;                 // key visible iff k_pos <= q_pos
  std::span<const int64_t> q_pos;      // (Sq) global positions of the queries; default 0..Sq-1
  std::span<const int64_t> k_pos;      // (Sk) global positions of the keys;    default 0..Sk-1
  std::span<const uint8_t> k_valid;    // (B, Sk) 1 = real key, 0 = padding; default all valid
  std::span<const int32_t> q_segment;  // (Sq) packed-sequence ids; keys only of the same segment
  std::span<const int32_t> k_segment;  // (Sk) (both given or neither)
};

struct AttnParams {
  float scale = 0.f;  // softmax scale; 0 means 1/sqrt(D)
  MaskSpec mask;
  int block_q = 0;  // kernel block sizes; 0 = the kernel's choice
  int block_k = 0;
  // Called between blocks by the kernel (may be empty): lets a communicator make progress on
  // transfers in flight while this rank computes.
  std::function<void()> progress;
  // flash_attention_into only: out and lse already hold a state over other keys (as a call wrote
  // it, or the empty state), and the call folds these keys into it: the result is
  // merge_into(state, attention over these keys) within the kernel's error bound, without a
  // second state or a merge pass (the ring's steps after the first). Not with row_max.
  bool accumulate = false;

  // ---- Fixed row maximum (const-max softmax; docs/kernel.md "Fixed row maximum") ----
  // row_max (B, Sq, H), optional: each query row's fixed softmax maximum in natural-log units of
  // the scaled logits scale·q·k, an upper bound on them (e.g. scale·|q|·max|k|). A row with a
  // finite entry uses it as its max for every key block and never rescales, so its sums over
  // different key sets add directly (Σ exp(s − row_max) is the same kind of number for all of
  // them); a NaN or infinite entry runs that row with the online softmax. The returned state is
  // normalized as always (out = O / l, lse = row_max + ln l). reference_attention ignores these.
  std::span<const float> row_max;
  // row_sum (B, Sq, H), optional output (needs row_max): for each fixed-max row
  // l = Σ exp(scale·q·k − row_max) over the keys it sees (0 if none); 0 for online rows.
  std::span<float> row_sum;
  // row_flags (B, Sq, H), optional output (needs row_max): 0 or an OR of
  //   kRowMaxExceeded: a key block's max exceeded row_max by more than the kernel's stale-max
  //     slack (8 in log2 units): the bound was wrong. The kernel then moved that row's max like
  //     the online softmax, so out and lse are right, but its O and l are no longer relative to
  //     row_max (row_sum is still Σ exp(s − row_max), computed by rescaling; it may be inf).
  //   kRowMaxLoose: row_max − lse > kRowMaxLooseLimit, or the row's sum is 0: the bound is so
  //     far above the row's logits that terms below exp(−87) relative to it flushed to zero
  //     (with the limit of 30 those are < exp(−57) of the row's total: still accurate; far
  //     beyond it the whole row underflows). Rows that see no key at all are flagged too.
  // Always 0 for online rows.
  std::span<uint8_t> row_flags;
  static constexpr uint8_t kRowMaxExceeded = 1;
  static constexpr uint8_t kRowMaxLoose = 2;
  static constexpr float kRowMaxLooseLimit = 30.f;  // natural-log units
};

// Blockwise online-softmax attention (flash attention) for fp32 or bf16/fp16 inputs (q, k, v
// of one dtype), fp32 accumulation. Fully masked blocks are skipped. Throws InvalidArgument on
// shape mismatches.
AttnState flash_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                          const AttnParams& params = {});
// The same, written into the caller's memory: out (B, Sq, H, D) fp32 with a contiguous head_dim
// and lse (B, Sq, H) fp32, any other strides (e.g. rows of a larger output, or (B, H, S, D)).
void flash_attention_into(const TensorView& q, const TensorView& k, const TensorView& v,
                          const AttnParams& params, const MutableTensorView& out,
                          const MutableTensorView& lse);
// Folds the keys k, v into the state: flash_attention_into with params.accumulate set, on the
// state's out and lse.
void flash_attention_fold(AttnState& state, const TensorView& q, const TensorView& k,
                          const TensorView& v, AttnParams params);

// The oracle: naive attention with double accumulation, one (b, h, query) row at a time.
// Inputs of any dtype and strides (converted to fp32 values exactly). Slow: O(B·Sq·Sk·H·D).
AttnState reference_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                              const AttnParams& params = {});

// Number of (b, h, q, k) score elements that the mask leaves visible: the attention work, for
// GFLOP/s (4·D flops each) and work imbalance. h counts query heads.
int64_t visible_score_elements(int64_t batch, int64_t heads, int64_t sq, int64_t sk,
                               const MaskSpec& mask);

// Description of the kernel path chosen on this CPU, e.g. "blockwise flash, oneDNN
// brg:avx512_core (fp32), AVX-512 softmax".
std::string attention_kernel_info();

// Checks q/k/v shapes and dtypes and the mask's spans; throws InvalidArgument naming what is wrong.
void validate_attention_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                               const MaskSpec& mask);

}  // namespace seqpar
