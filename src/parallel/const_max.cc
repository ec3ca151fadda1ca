// const-max softmax for the ring (docs/algorithms.md "const-max ring"): per-row bounds from
// all-reduced key norms, and the accumulator that adds the ring steps' sums without rescaling.
// Used by ring_over_blocks (ring.cc), so by ring and usp's ring part.
//
// Accepts: const_max_row_bounds: the ring's communicator, this member's q (B, Sq, H, D) and its
//   own block k (B, Sk, Hkv, D) at k_pos; CpOptions (scale, valid_len: padding keys left out).
//   ConstMaxAccumulator: those bounds, then the state of each block as the kernel returns it.
// Returns: the bounds M (B, Sq, H), natural log; finish(): the state of the rows over every
//   block added, out (B, Sq, H, D) and lse (B, Sq, H), fp32, and fallback_rows().
// Steps on member r of N (the ring's steps, ring.cc):
//   step 0 (before the ring): per (batch, kv head) the largest norm of a key of the own block;
//     all_reduce(max) of these B·Hkv fp32 values gives K(b, hk); M = scale·|q|·K(b, h / (H/Hkv))
//   first block attended (online softmax): a row is fixed if |M - lse_0| <= 30, then continues
//     with l = exp(lse_0 - M), O = out_0·l; else it falls back and keeps (out_0, lse_0)
//   every later block: the kernel runs fixed rows with the max M (and fallback rows online in
//     the same call); fixed rows add O += out·l_s, l += l_s, fallback rows merge by LSE; a fixed
//     row the kernel flags exceeded is normalized and falls back from then on
//   finish: fixed rows out = O / l, lse = M + ln l
// Blocks met by member 1, N = 4 (the ring's order; any order gives the same sums up to fp32
// rounding):
//   step   block   fixed rows                   fallback rows
//   0      1       decided: O = out_0·l, l      (out_0, lse_0)
//   1      0       O += out·l_s, l += l_s       merge by LSE
//   2      3       the same                     the same
//   3      2       the same                     the same
// Bytes per member: the ring's, plus 4·B·Hkv·(N-1) each way (the all-reduce; nothing with one
//   member).
// Memory: per query row (b, i, h) 29 bytes besides the state: M, the kernel's max and the last
//   block's row sum (fp32), M as the kernel applies it and l (fp64), the row flags (1 byte).
// Limitations: a row whose first block holds only small logits falls back even if later blocks
//   would bring its lse within 30 of M (the count is conservative); one key with a huge norm
//   loosens the bound of its whole (batch, kv head); not with schedule steal, pass-Q, pass-KV,
//   allgather or plain ulysses.
//
// Numbers per query row (b, i, h), natural-log units of the scaled logits s = scale·q·k:
//   M            the bound: scale·|q|·max|k| >= every s of the row (Cauchy–Schwarz)
//   M_eff        what the kernel subtracts: fp32(M·log2 e) in log2 units, i.e. fp32(M·log2 e)·ln 2
//   l            Σ exp(s − M_eff) over the blocks added so far
//   O            Σ exp(s − M_eff)·v, so out = O / l and lse = M_eff + ln l
#include <cmath>
#include <limits>

#include "schedule_build.h"
#include "strategy_common.h"

namespace seqpar {

namespace {

// The kernel's constants (src/attention/flash.cc), so M_eff here equals the max it applies.
constexpr double kLog2e = 1.44269504088896340736;
constexpr double kLn2 = 0.69314718055994530942;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Rows as fp32 values: the tensor itself, or a converted copy held in `tmp`.
const float* as_f32(const Tensor& t, Tensor& tmp) {
  if (t.dtype() == DType::kF32) return t.data<float>();
  tmp = t.to(DType::kF32);
  return tmp.data<float>();
}

double norm(const float* x, int64_t d) {
  double s = 0;
  for (int64_t i = 0; i < d; ++i) s += static_cast<double>(x[i]) * x[i];
  return std::sqrt(s);
}

}  // namespace

std::vector<float> const_max_row_bounds(Communicator& comm, const TensorView& q_in,
                                        const Tensor& k, std::span<const int64_t> k_pos,
                                        const CpOptions& opts) {
  const Tensor q = q_in.contiguous();  // read once, as dense rows
  const int64_t B = q.dim(0), Sq = q.dim(1), H = q.dim(2), D = q.dim(3);
  const int64_t Sk = k.dim(1), Hkv = k.dim(2), group = H / Hkv;
  SEQPAR_CHECK(static_cast<int64_t>(k_pos.size()) == Sk, "one position per key");
  // Step 0: the largest key norm per (b, kv head) over this block, then over every member.
  Tensor tmp;
  const float* kf = as_f32(k, tmp);
  std::vector<float> kmax(static_cast<size_t>(B * Hkv), 0.f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < Sk; ++j) {
      if (opts.valid_len > 0 && k_pos[j] >= opts.valid_len) continue;  // padding: masked
      for (int64_t hk = 0; hk < Hkv; ++hk) {
        // fp32 rounding may put the bound an ulp below a logit: harmless, the kernel moves a
        // fixed max only when a block exceeds it by its stale-max slack (2^8).
        float& m = kmax[b * Hkv + hk];
        m = std::max(m, static_cast<float>(norm(kf + ((b * Sk + j) * Hkv + hk) * D, D)));
      }
    }
  comm.all_reduce(std::span<float>(kmax), ReduceOp::kMax);

  const double scale = opts.scale != 0.f ? opts.scale : 1.0 / std::sqrt(static_cast<double>(D));
  const float* qf = as_f32(q, tmp);
  std::vector<float> bound(static_cast<size_t>(B * Sq * H));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Sq; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t row = (b * Sq + i) * H + h;
        bound[row] = static_cast<float>(scale * norm(qf + row * D, D) * kmax[b * Hkv + h / group]);
      }
  return bound;
}

ConstMaxAccumulator::ConstMaxAccumulator(std::vector<float> bounds) : bound_(std::move(bounds)) {
  const size_t n = bound_.size();
  bound_eff_.resize(n);
  kernel_max_.assign(n, kNaN);
  l_.assign(n, 0.0);
  step_sum_.assign(n, 0.f);
  step_flags_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const float m2 = std::isfinite(bound_[i]) ? static_cast<float>(bound_[i] * kLog2e) : kNegInf;
    bound_eff_[i] = std::isfinite(m2) ? static_cast<double>(m2) * kLn2 : kNaN;
  }
}

void ConstMaxAccumulator::start(AttnState first) {
  SEQPAR_CHECK(!started_, "start() once");
  SEQPAR_CHECK(static_cast<size_t>(first.lse.numel()) == bound_.size(), "state rows vs bounds");
  acc_ = std::move(first);
  started_ = true;
  const int64_t d = acc_.head_dim();
  float* out = acc_.out.data<float>();
  const float* lse = acc_.lse.data<float>();
  for (size_t i = 0; i < bound_.size(); ++i) {
    // Fixed iff M − lse <= the loose limit: then l stays >= exp(−30) however the later blocks
    // go. A bound more than the limit below the lse is wrong (lse <= max + ln(keys) <= M + 30
    // for any real key count), and exp(lse − M) could overflow: such rows fall back too.
    const float gap = bound_[i] - lse[i];
    if (!(std::isfinite(bound_eff_[i]) && std::isfinite(lse[i]) &&
          gap <= AttnParams::kRowMaxLooseLimit && gap >= -AttnParams::kRowMaxLooseLimit))
      continue;  // falls back: keeps the normalized state
    const double l = std::exp(static_cast<double>(lse[i]) - bound_eff_[i]);
    const float fl = static_cast<float>(l);
    for (int64_t x = 0; x < d; ++x) out[i * d + x] *= fl;
    l_[i] = l;
    kernel_max_[i] = bound_[i];
  }
}

void ConstMaxAccumulator::prepare(AttnParams& params) {
  SEQPAR_CHECK(started_, "start() before prepare()");
  params.row_max = kernel_max_;
  params.row_sum = step_sum_;
  params.row_flags = step_flags_;
}

void ConstMaxAccumulator::add(const AttnState& part) {
  SEQPAR_CHECK(started_, "start() before add()");
  SEQPAR_CHECK(part.lse.numel() == acc_.lse.numel(), "state rows");
  const int64_t d = acc_.head_dim();
  float* out = acc_.out.data<float>();
  float* lse = acc_.lse.data<float>();
  const float* pout = part.out.data<float>();
  const float* plse = part.lse.data<float>();
  for (size_t i = 0; i < bound_.size(); ++i) {
    float* o = out + i * d;
    const float* po = pout + i * d;
    if (!std::isnan(kernel_max_[i])) {
      if ((step_flags_[i] & AttnParams::kRowMaxExceeded) == 0) {
        // The sums of this block are relative to the same max: add them as they are.
        const float ls = step_sum_[i];
        if (ls > 0.f) {
          for (int64_t x = 0; x < d; ++x) o[x] += po[x] * ls;
          l_[i] += ls;
        }
        continue;
      }
      // Exceeded: the bound was wrong. Normalize what this row holds; online from now on.
      const double l = l_[i];
      const float inv = static_cast<float>(1.0 / l);
      for (int64_t x = 0; x < d; ++x) o[x] *= inv;
      lse[i] = static_cast<float>(bound_eff_[i] + std::log(l));
      kernel_max_[i] = kNaN;
    }
    merge_row(o, lse + i, po, plse[i], d);
  }
}

AttnState ConstMaxAccumulator::finish() {
  SEQPAR_CHECK(started_, "start() before finish()");
  const int64_t d = acc_.head_dim();
  float* out = acc_.out.data<float>();
  float* lse = acc_.lse.data<float>();
  for (size_t i = 0; i < bound_.size(); ++i) {
    if (std::isnan(kernel_max_[i])) continue;
    const double l = l_[i];  // >= exp(-30) since start
    const float inv = static_cast<float>(1.0 / l);
    for (int64_t x = 0; x < d; ++x) out[i * d + x] *= inv;
    lse[i] = static_cast<float>(bound_eff_[i] + std::log(l));
  }
  return std::move(acc_);
}

int64_t ConstMaxAccumulator::fallback_rows() const {
  int64_t n = 0;
  for (float m : kernel_max_) n += std::isnan(m);
  return n;
}

// const_max_row_bounds' all-reduce: B·kv_heads fp32 maxima, each member's to every other.
Step key_norms_step(const CallRuns& c, GroupMembers members, int64_t kv_heads, CommGroup group) {
  const uint64_t bytes = 4ull * c.B * kv_heads * (members.size() - 1);
  return collective_step(OpKind::kAllReduce, false, "key norms", group, members, bytes, bytes);
}

}  // namespace seqpar
