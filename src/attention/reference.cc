// The oracle (reference_attention), the attention-work counter (visible_score_elements) and the
// argument checks shared by every attention entry point (validate_attention_inputs).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "seqpar/attention/attention.h"
#include "seqpar/core/error.h"

namespace seqpar {

namespace {

void check_span(size_t got, int64_t want, const char* name, const char* what) {
  SEQPAR_ARG_CHECK(got == 0 || static_cast<int64_t>(got) == want, "mask.", name, " has ", got,
                   " entries; valid: 0 (", what, ") or ", want);
}

// Element (b, i, j) visibility under a MaskSpec, with the default positions filled in.
struct MaskView {
  const MaskSpec& m;
  int64_t sk;
  int64_t qpos(int64_t i) const { return m.q_pos.empty() ? i : m.q_pos[i]; }
  int64_t kpos(int64_t j) const { return m.k_pos.empty() ? j : m.k_pos[j]; }
  bool visible(int64_t b, int64_t i, int64_t j) const {
    if (m.causal && kpos(j) > qpos(i)) return false;
    if (!m.k_valid.empty() && m.k_valid[b * sk + j] == 0) return false;
    if (!m.q_segment.empty() && m.q_segment[i] != m.k_segment[j]) return false;
    return true;
  }
};

bool all_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  return true;
}

double dot(const float* a, const float* b, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += static_cast<double>(a[i]) * b[i];
    s1 += static_cast<double>(a[i + 1]) * b[i + 1];
    s2 += static_cast<double>(a[i + 2]) * b[i + 2];
    s3 += static_cast<double>(a[i + 3]) * b[i + 3];
  }
  for (; i < n; ++i) s0 += static_cast<double>(a[i]) * b[i];
  return (s0 + s1) + (s2 + s3);
}

}  // namespace

void validate_attention_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                               const MaskSpec& mask) {
  SEQPAR_ARG_CHECK(q.ndim() == 4, "q must be 4-D (batch, seq, heads, head_dim); got shape ",
                   q.shape_str());
  SEQPAR_ARG_CHECK(k.ndim() == 4, "k must be 4-D (batch, seq, kv_heads, head_dim); got shape ",
                   k.shape_str());
  SEQPAR_ARG_CHECK(v.ndim() == 4, "v must be 4-D (batch, seq, kv_heads, head_dim); got shape ",
                   v.shape_str());
  const int64_t b = q.dim(0), sq = q.dim(1), h = q.dim(2), d = q.dim(3);
  const int64_t sk = k.dim(1), hkv = k.dim(2);
  SEQPAR_ARG_CHECK(k.dim(0) == b && v.dim(0) == b, "batch: q has ", b, " rows but k has ", k.dim(0),
                   " and v has ", v.dim(0), "; valid: ", b);
  SEQPAR_ARG_CHECK(d >= 1, "head_dim ", d, " is invalid; valid: >= 1");
  SEQPAR_ARG_CHECK(k.dim(3) == d && v.dim(3) == d, "head_dim: q has ", d, " but k has ", k.dim(3),
                   " and v has ", v.dim(3), "; valid: ", d);
  SEQPAR_ARG_CHECK(v.dim(1) == sk && v.dim(2) == hkv, "v shape ", v.shape_str(),
                   " must equal k shape ", k.shape_str());
  SEQPAR_ARG_CHECK(h >= 1, "heads ", h, " is invalid; valid: >= 1");
  SEQPAR_ARG_CHECK(hkv >= 1, "kv_heads ", hkv, " is invalid; valid kv_heads: ", divisors_text(h));
  SEQPAR_ARG_CHECK(h % hkv == 0, "heads ", h, " is not divisible by kv_heads ", hkv,
                   "; valid kv_heads: ", divisors_text(h));
  SEQPAR_ARG_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(),
                   "dtype: q, k and v must have one dtype; got q ", dtype_name(q.dtype()), ", k ",
                   dtype_name(k.dtype()), ", v ", dtype_name(v.dtype()),
                   "; valid: all fp32, all bf16 or all fp16");
  check_span(mask.q_pos.size(), sq, "q_pos", "positions 0..Sq-1");
  check_span(mask.k_pos.size(), sk, "k_pos", "positions 0..Sk-1");
  check_span(mask.k_valid.size(), b * sk, "k_valid", "all keys valid; else B*Sk");
  SEQPAR_ARG_CHECK(mask.q_segment.empty() == mask.k_segment.empty(),
                   "mask.q_segment and mask.k_segment must be given together; got ",
                   mask.q_segment.size(), " and ", mask.k_segment.size(), " entries");
  check_span(mask.q_segment.size(), sq, "q_segment", "no segments");
  check_span(mask.k_segment.size(), sk, "k_segment", "no segments");
}

AttnState reference_attention(const TensorView& q_in, const TensorView& k_in,
                              const TensorView& v_in, const AttnParams& params) {
  validate_attention_inputs(q_in, k_in, v_in, params.mask);
  const int64_t nb = q_in.dim(0), sq = q_in.dim(1), nh = q_in.dim(2), d = q_in.dim(3);
  const int64_t sk = k_in.dim(1), nkv = k_in.dim(2);
  const int64_t group = nh / nkv;
  const double scale = params.scale != 0.f ? params.scale : 1.0 / std::sqrt(static_cast<double>(d));
  // fp32 copies (exact for bf16/fp16 inputs).
  const Tensor q = q_in.contiguous().to(DType::kF32), k = k_in.contiguous().to(DType::kF32),
               v = v_in.contiguous().to(DType::kF32);
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  AttnState st = AttnState::empty(nb, sq, nh, d);
  float* out = st.out.data<float>();
  float* lse = st.lse.data<float>();
  const MaskView mv{params.mask, sk};
  const int64_t rows = nb * sq * nh;
  // Non-finite inputs (docs/kernel.md "Numerics: non-finite inputs"): (b, key, kv head) with an Inf
  // or NaN in its k or v row. A row with a non-finite q, or that sees such a key, is NaN.
  std::vector<uint8_t> kv_bad(static_cast<size_t>(nb * sk * nkv));
  for (int64_t x = 0; x < nb * sk * nkv; ++x) {
    kv_bad[x] = !all_finite(kp + x * d, d) || !all_finite(vp + x * d, d);
  }

#pragma omp parallel if (rows > 1 && static_cast <double>(rows) * sk * d > 1e6)
  {
    std::vector<double> score(static_cast<size_t>(sk));
    std::vector<double> acc(static_cast<size_t>(d));
#pragma omp for schedule(dynamic, 8)
    for (int64_t r = 0; r < rows; ++r) {
      // Row r is (b, i, h) of the token-major (B, Sq, H) grid.
      const int64_t h = r % nh, i = (r / nh) % sq, b = r / (nh * sq);
      const int64_t hk = h / group;
      const float* qrow = qp + r * d;
      bool saw_key = false, nonfinite = !all_finite(qrow, d);
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < sk; ++j) {
        if (!mv.visible(b, i, j)) {
          score[j] = -std::numeric_limits<double>::infinity();
          continue;
        }
        saw_key = true;
        nonfinite = nonfinite || kv_bad[(b * sk + j) * nkv + hk];
        score[j] = scale * dot(qrow, kp + ((b * sk + j) * nkv + hk) * d, d);
        mx = std::max(mx, score[j]);
      }
      if (!saw_key) continue;  // stays empty: 0, -inf
      if (nonfinite) {
        std::fill_n(out + r * d, d, std::numeric_limits<float>::quiet_NaN());
        lse[r] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double sum = 0;
      for (int64_t j = 0; j < sk; ++j) {
        if (score[j] == -std::numeric_limits<double>::infinity()) continue;
        const double p = std::exp(score[j] - mx);
        sum += p;
        const float* vrow = vp + ((b * sk + j) * nkv + hk) * d;
        for (int64_t e = 0; e < d; ++e) acc[e] += p * vrow[e];
      }
      for (int64_t e = 0; e < d; ++e) out[r * d + e] = static_cast<float>(acc[e] / sum);
      lse[r] = static_cast<float>(mx + std::log(sum));
    }
  }
  return st;
}

int64_t visible_score_elements(int64_t batch, int64_t heads, int64_t sq, int64_t sk,
                               const MaskSpec& mask) {
  SEQPAR_ARG_CHECK(batch >= 0 && heads >= 0 && sq >= 0 && sk >= 0,
                   "visible_score_elements: negative size; valid: >= 0");
  check_span(mask.q_pos.size(), sq, "q_pos", "positions 0..Sq-1");
  check_span(mask.k_pos.size(), sk, "k_pos", "positions 0..Sk-1");
  check_span(mask.k_valid.size(), batch * sk, "k_valid", "all keys valid; else B*Sk");
  SEQPAR_ARG_CHECK(mask.q_segment.empty() == mask.k_segment.empty(),
                   "mask.q_segment and mask.k_segment must be given together");
  check_span(mask.q_segment.size(), sq, "q_segment", "no segments");
  check_span(mask.k_segment.size(), sk, "k_segment", "no segments");
  if (batch == 0 || heads == 0 || sq == 0 || sk == 0) return 0;
  const bool seg = !mask.q_segment.empty();
  const bool valid = !mask.k_valid.empty();
  if (!mask.causal && !seg && !valid) return batch * heads * sq * sk;

  // Keys in (segment, position) order; then a query's visible keys are one contiguous run
  // (its segment's keys with position <= its own), counted with prefix sums of validity.
  // O((Sq + Sk) log Sk) per batch, whatever the layout (contiguous, striped, zigzag, unsorted).
  struct Key {
    int64_t seg, pos;
    int64_t idx;
  };
  std::vector<Key> keys(static_cast<size_t>(sk));
  for (int64_t j = 0; j < sk; ++j) {
    keys[j] = {seg ? mask.k_segment[j] : 0, mask.k_pos.empty() ? j : mask.k_pos[j], j};
  }
  auto key_less = [](const Key& a, const Key& b) {
    return a.seg != b.seg ? a.seg < b.seg : a.pos < b.pos;
  };
  if (!std::is_sorted(keys.begin(), keys.end(), key_less)) {
    std::stable_sort(keys.begin(), keys.end(), key_less);
  }
  // The run of visible sorted keys [lo, hi) of each query (the same for every batch).
  std::vector<std::pair<int64_t, int64_t>> run(static_cast<size_t>(sq));
  for (int64_t i = 0; i < sq; ++i) {
    const int64_t qs = seg ? mask.q_segment[i] : 0;
    const int64_t qp = mask.q_pos.empty() ? i : mask.q_pos[i];
    auto lo = std::lower_bound(keys.begin(), keys.end(), qs,
                               [](const Key& k, int64_t s) { return k.seg < s; });
    auto hi = mask.causal ? std::upper_bound(lo, keys.end(), Key{qs, qp, 0}, key_less)
                          : std::upper_bound(lo, keys.end(), qs,
                                             [](int64_t s, const Key& k) { return s < k.seg; });
    run[i] = {lo - keys.begin(), hi - keys.begin()};
  }
  int64_t total = 0;
  std::vector<int64_t> prefix(static_cast<size_t>(sk) + 1);
  for (int64_t b = 0; b < (valid ? batch : 1); ++b) {
    for (int64_t j = 0; j < sk; ++j) {
      prefix[j + 1] = prefix[j] + (valid ? (mask.k_valid[b * sk + keys[j].idx] != 0) : 1);
    }
    int64_t per_batch = 0;
    for (int64_t i = 0; i < sq; ++i) per_batch += prefix[run[i].second] - prefix[run[i].first];
    total += per_batch;
  }
  if (!valid) total *= batch;
  return total * heads;
}

}  // namespace seqpar
