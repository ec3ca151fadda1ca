// The one entry point (cp_attention.h): validate, derive the options, dispatch through the
// strategy table, write the caller's outputs.
#include "seqpar/parallel/cp_attention.h"

#include <cstring>

#include "seqpar/core/error.h"
#include "seqpar/core/param_error.h"
#include "seqpar/parallel/decode.h"
#include "seqpar/parallel/strategy_table.h"

namespace seqpar {

namespace {

// The placement against the configuration, the shape and the communicators.
void check_placement(const ParallelConfig& c, const AttnShape& s, SpComms& comms,
                     const Placement& place) {
  const int n = comms.sp().size();
  SEQPAR_PARAM_CHECK(c.sp() == n, "ulysses_degree", detail::concat("a divisor of ", n),
                     param("ulysses_degree"), " ", c.mesh.ulysses, " x ", param("ring_degree"), " ",
                     c.mesh.ring, " must equal the ", n, " ranks of the sequence-parallel group");
  SEQPAR_PARAM_CHECK(!uses_ulysses(c.strategy) || comms.ulysses_degree() == c.mesh.ulysses,
                     "ulysses_degree", detail::concat(comms.ulysses_degree()),
                     "the communicators' Ulysses groups have ", comms.ulysses_degree(),
                     " ranks but ", param("ulysses_degree"), " is ", c.mesh.ulysses);
  SEQPAR_ARG_CHECK(place.over_cache == s.over_cache(), "the placement is over a ",
                   place.over_cache ? "K/V cache" : "sequence", " but the shape is over a ",
                   s.over_cache() ? "K/V cache (cached, new)" : "sequence");
  SEQPAR_ARG_CHECK(place.ranks() == n, "the placement has ", place.ranks(), " ranks but the ",
                   "sequence-parallel group has ", n);
  if (place.over_cache) {
    int64_t kv = 0, q = 0;
    for (int r = 0; r < n; ++r) {
      kv += static_cast<int64_t>(place.cache.kv_pos[r].size());
      q += static_cast<int64_t>(place.cache.q_pos[r].size());
    }
    SEQPAR_PARAM_CHECK(kv == s.cached + s.fresh && q == s.fresh, q != s.fresh ? "new" : "cached",
                       detail::concat(q != s.fresh ? q : kv - q), "the placement holds ", kv,
                       " K/V tokens and ", q, " queries; ", param("cached"), " ", s.cached, " and ",
                       param("new"), " ", s.fresh, " need ", s.cached + s.fresh, " and ", s.fresh);
  } else {
    SEQPAR_PARAM_CHECK(place.part.seq() >= s.seq, "seq",
                       detail::concat("at most ", place.part.seq()),
                       "the placement's sequence holds ", place.part.seq(), " tokens, fewer than ",
                       param("seq"), " ", s.seq);
  }
}

// An input the caller gave, checked against its shape and dtype.
void check_input(const char* name, const TensorView& t, std::initializer_list<int64_t> shape,
                 DType dtype) {
  const std::vector<int64_t> want(shape);
  SEQPAR_ARG_CHECK(t.shape() == want, name, " is ", t.shape_str(), "; expected ", shape_text(want),
                   " on this rank");
  SEQPAR_ARG_CHECK(t.dtype() == dtype, name, " is ", dtype_name(t.dtype()), "; q, k and v ",
                   "(and the text's) must have one dtype, ", dtype_name(dtype));
}

bool given(const TensorView& v) { return v.ndim() > 0; }

// Moves the state's `from` into the caller's output in `dtype` (fp32, or the inputs' dtype: the
// fp32 values rounded once): a view given: written there; else a Tensor given: checked and
// written; else: taken.
void write_output(const char* name, Tensor& to, const MutableTensorView& into, Tensor&& from,
                  DType dtype) {
  if (given(into)) {
    SEQPAR_ARG_CHECK(into.shape() == from.shape() && into.dtype() == dtype, name, " is ",
                     into.shape_str(), " ", dtype_name(into.dtype()), "; expected ",
                     from.shape_str(), " ", dtype_name(dtype));
    into.copy_from(from);
    return;
  }
  if (from.dtype() != dtype) from = from.to(dtype);
  if (to.empty() && to.ndim() == 0) {
    to = std::move(from);
    return;
  }
  SEQPAR_ARG_CHECK(to.shape() == from.shape() && to.dtype() == dtype, name, " is ", to.shape_str(),
                   " ", dtype_name(to.dtype()), "; expected ", from.shape_str(), " ",
                   dtype_name(dtype));
  if (from.nbytes() > 0) std::memcpy(to.raw(), from.raw(), from.nbytes());
}

// The lse the shape asks for (s.lse), or none: a given one is refused.
void write_lse(const AttnShape& s, const char* name, Tensor& to, const MutableTensorView& into,
               Tensor&& from) {
  if (s.lse) return write_output(name, to, into, std::move(from), DType::kF32);
  SEQPAR_PARAM_CHECK(to.empty() && to.ndim() == 0 && !given(into), "lse", "true", name,
                     " is given but ", param("lse"), " is off: leave it empty or set ",
                     param("lse"));
}

}  // namespace

Placement place_call(const ParallelConfig& c, const AttnShape& s) {
  Placement p;
  p.over_cache = s.over_cache();
  if (!p.over_cache) {
    p.part = sequence_partition(c, s);
  } else if (s.cached_lens.empty()) {
    p.cache = decode_placement(s.cached, s.fresh, c.sp(), c.layout);
  } else {
    p.cache = decode_placement(s.cached_lens, s.fresh_lens, c.sp(), c.layout);
  }
  return p;
}

CpOptions cp_options(const ParallelConfig& c, const AttnShape& s, const Placement& place,
                     const KernelOptions& kernel) {
  CpOptions o;
  o.causal = s.causal;
  o.scale = kernel.scale;
  o.block_q = kernel.block_q;
  o.block_k = kernel.block_k;
  o.ulysses_mode = c.ulysses_mode;
  o.softmax = c.softmax;
  o.schedule = c.schedule;
  if (!place.over_cache && place.part.seq() > s.seq) o.valid_len = s.seq;
  o.cu_seqlens = shape_cu_seqlens(s);
  const AttnShape kept = image_call(s);  // what the strategy returns
  o.out_dtype = kept.out_dtype;
  o.lse = kept.lse;
  o.kv_use = kept.kv_use;
  return o;
}

void attention(const ParallelConfig& c, const AttnShape& s, SpComms& comms, const Placement& place,
               const AttnInputs& in, AttnOutputs& out, CpStats* stats,
               const KernelOptions& kernel) {
  validate_config(c, s);
  check_placement(c, s, comms, place);
  const int r = comms.sp().rank();
  const int64_t B = s.batch, H = s.heads, Hkv = s.kv(), D = s.head_dim;
  const int64_t nq = static_cast<int64_t>(place.q_pos(r).size());
  const int64_t nkv = static_cast<int64_t>(place.kv_pos(r).size());
  const DType dtype = in.q.dtype();
  check_input("q", in.q, {B, nq, H, D}, dtype);
  check_input("k", in.k, {B, nkv, Hkv, D}, dtype);
  check_input("v", in.v, {B, nkv, Hkv, D}, dtype);
  CpOptions opts = cp_options(c, s, place, kernel);
  const int64_t T = s.text_tokens;
  if (T == 0) {  // the views as given: each strategy reads them where they lie or packs them
    const StrategyArgs args{comms, place, in.q, in.k, in.v, opts, stats};
    AttnState state = schedule_row(c.strategy, c.schedule).run(args);
    if (stats != nullptr) stats->input_addresses = {in.q.raw(), in.k.raw(), in.v.raw()};
    write_output("out", out.out, out.out_into, std::move(state.out), s.out_dtype);
    write_lse(s, "lse", out.lse, out.lse_into, std::move(state.lse));
    return;
  }
  SEQPAR_PARAM_CHECK(given(in.text_q) && given(in.text_k) && given(in.text_v), "text_tokens",
                     "0 without text tensors", param("text_tokens"), " ", T,
                     " (joint attention) needs text_q, text_k and text_v");
  // The text's heads: all of them, or (text_by_heads) this Ulysses member's.
  const int u = comms.ulysses_degree(), me = comms.ulysses().rank();
  const int64_t Ht = s.text_by_heads ? ulysses_q_heads(H, u, me).size() : H;
  const int64_t Hkvt = s.text_by_heads ? ulysses_kv_heads(H, Hkv, u, me).size() : Hkv;
  check_input("text_q", in.text_q, {B, T, Ht, D}, dtype);
  check_input("text_k", in.text_k, {B, T, Hkvt, D}, dtype);
  check_input("text_v", in.text_v, {B, T, Hkvt, D}, dtype);
  JointState js;
  if (s.text_by_heads) {  // takes dense tensors: a dense view as it is, else packed once
    const Tensor q = in.q.contiguous(), k = in.k.contiguous(), v = in.v.contiguous();
    js = ulysses_joint_attention(c.strategy, comms, place.part, q, k, v, in.text_q.contiguous(),
                                 in.text_k.contiguous(), in.text_v.contiguous(), opts, stats);
    if (stats != nullptr) stats->input_addresses = {q.raw(), k.raw(), v.raw()};
  } else {  // the views as given
    js = joint_attention(c.strategy, comms, place.part, in.q, in.k, in.v, in.text_q, in.text_k,
                         in.text_v, opts, stats);
    if (stats != nullptr) stats->input_addresses = {in.q.raw(), in.k.raw(), in.v.raw()};
  }
  write_output("out", out.out, out.out_into, std::move(js.image.out), s.out_dtype);
  write_lse(s, "lse", out.lse, out.lse_into, std::move(js.image.lse));
  write_output("text_out", out.text_out, out.text_out_into, std::move(js.text.out), s.out_dtype);
  write_lse(s, "text_lse", out.text_lse, out.text_lse_into, std::move(js.text.lse));
}

}  // namespace seqpar
