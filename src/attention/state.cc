// Attention states and their merge (see state.h). Every merge goes through merge_row, so blocks
// inside the kernel, ring steps, pass-Q partials and decode all combine states the same way.
#include "seqpar/attention/state.h"

#include <limits>

#include "seqpar/core/error.h"

namespace seqpar {

AttnState AttnState::empty(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim) {
  SEQPAR_ARG_CHECK(batch >= 0 && seq >= 0 && heads >= 0 && head_dim >= 0,
                   "AttnState::empty: negative dimension (batch ", batch, ", seq ", seq, ", heads ",
                   heads, ", head_dim ", head_dim, "); valid: >= 0");
  AttnState st;
  st.out = Tensor({batch, seq, heads, head_dim}, DType::kF32);  // zero-filled
  st.lse = Tensor({batch, seq, heads}, DType::kF32);
  st.lse.fill(-std::numeric_limits<float>::infinity());
  return st;
}

namespace {

void check_state(const AttnState& s, const char* name) {
  SEQPAR_ARG_CHECK(s.out.ndim() == 4 && s.out.dtype() == DType::kF32, "merge: ", name,
                   ".out must be fp32 (B, S, H, D); got ", s.out.shape_str(), " ",
                   dtype_name(s.out.dtype()));
  SEQPAR_ARG_CHECK(s.lse.ndim() == 3 && s.lse.dtype() == DType::kF32 &&
                       s.lse.dim(0) == s.out.dim(0) && s.lse.dim(1) == s.out.dim(1) &&
                       s.lse.dim(2) == s.out.dim(2),
                   "merge: ", name, ".lse must be fp32 (B, S, H) = ", s.out.shape_str(),
                   " without D; got ", s.lse.shape_str());
}

}  // namespace

void merge_into(AttnState& acc, const AttnState& part) {
  check_state(acc, "acc");
  check_state(part, "part");
  SEQPAR_ARG_CHECK(acc.out.shape() == part.out.shape(), "merge: state shapes differ: acc ",
                   acc.out.shape_str(), " vs part ", part.out.shape_str());
  const int64_t rows = acc.lse.numel();  // B·S·H rows of D
  const int64_t d = acc.head_dim();
  float* o_a = acc.out.data<float>();
  float* lse_a = acc.lse.data<float>();
  const float* o_b = part.out.data<float>();
  const float* lse_b = part.lse.data<float>();
  for (int64_t r = 0; r < rows; ++r) merge_row(o_a + r * d, lse_a + r, o_b + r * d, lse_b[r], d);
}

AttnState merge_states(const AttnState& a, const AttnState& b) {
  AttnState out = a;
  merge_into(out, b);
  return out;
}

}  // namespace seqpar
