// Attention state: the normalized output of attention over some set of keys, plus the
// log-sum-exp of its scores (natural log). Two states over disjoint key sets merge into the state
// over their union. One merge path serves kernel blocks, ring steps, pass-Q partials and decode.
// Thread-safety: values and pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "seqpar/core/tensor.h"

namespace seqpar {

struct AttnState {
  Tensor out;  // (B, Sq, H, D) fp32, normalized (sum of weights 1; 0 for an empty row)
  Tensor lse;  // (B, Sq, H) fp32, natural log; -inf for a row that saw no key

  // The empty state for (B, Sq, H, D): out = 0, lse = -inf.
  static AttnState empty(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim);
  int64_t batch() const { return out.dim(0); }
  int64_t seq() const { return out.dim(1); }
  int64_t heads() const { return out.dim(2); }
  int64_t head_dim() const { return out.dim(3); }
};

// Merges one row: (o_a, lse_a) <- merge((o_a, lse_a), (o_b, lse_b)), o of length d.
// Empty-safe: an empty side (lse = -inf) leaves the other unchanged; two empties stay empty.
inline void merge_row(float* o_a, float* lse_a, const float* o_b, float lse_b, int64_t d) {
  const float la = *lse_a;
  if (lse_b == -std::numeric_limits<float>::infinity()) return;
  if (la == -std::numeric_limits<float>::infinity()) {
    for (int64_t i = 0; i < d; ++i) o_a[i] = o_b[i];
    *lse_a = lse_b;
    return;
  }
  const float m = la > lse_b ? la : lse_b;
  const float wa = std::exp(la - m);
  const float wb = std::exp(lse_b - m);
  const float s = wa + wb;  // >= 1
  const float ca = wa / s, cb = wb / s;
  for (int64_t i = 0; i < d; ++i) o_a[i] = ca * o_a[i] + cb * o_b[i];
  *lse_a = m + std::log(s);
}

// acc <- merge(acc, part); shapes must match. Pure in the mathematical sense: associative,
// commutative, empty state is the identity.
void merge_into(AttnState& acc, const AttnState& part);
// Returns merge(a, b).
AttnState merge_states(const AttnState& a, const AttnState& b);

}  // namespace seqpar
