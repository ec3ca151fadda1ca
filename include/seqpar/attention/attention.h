// Local attention on one rank (no communication): the blockwise flash-attention kernel and the
// naive reference that every result is checked against.
//
// Shapes (token-major):
//   q (B, Sq, H, D)   k, v (B, Sk, Hkv, D)   -> AttnState{out (B, Sq, H, D), lse (B, Sq, H)}
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
};

// Blockwise online-softmax attention (flash attention) for fp32 or bf16/fp16 inputs (q, k, v
// of one dtype), fp32 accumulation. Fully masked blocks are skipped. Throws InvalidArgument on
// shape mismatches.
AttnState flash_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                          const AttnParams& params = {});

// The oracle: naive attention with double accumulation, one (b, h, query) row at a time.
// Inputs of any dtype (converted to fp32 values exactly). Slow: O(B·Sq·Sk·H·D).
AttnState reference_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                              const AttnParams& params = {});

// Number of (b, h, q, k) score elements that the mask leaves visible: the attention work, for
// GFLOP/s (4·D flops each) and work imbalance. h counts query heads.
int64_t visible_score_elements(int64_t batch, int64_t heads, int64_t sq, int64_t sk,
                               const MaskSpec& mask);

// Description of the kernel path chosen on this CPU, e.g. "blockwise flash, oneDNN
// brg:avx512_core (fp32), AVX-512 softmax".
std::string attention_kernel_info();

// Checks q/k/v shapes and dtypes and the mask's spans; throws InvalidArgument naming what is wrong.
void validate_attention_inputs(const Tensor& q, const Tensor& k, const Tensor& v,
                               const MaskSpec& mask);

}  // namespace seqpar
