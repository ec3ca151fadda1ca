// ulysses (DeepSpeed-Ulysses; docs/algorithms.md "ulysses") and usp (Ulysses inside, ring
// across; "usp"): an all-to-all turns sequence shards into head shards, each member attends its
// heads over the whole (group) sequence, and an all-to-all turns the result back.
//
// Accepts: a Partition (any layout, uneven and padded shards, documents); this member's
//   q (B, n_r, H, D) and k, v (B, n_r, Hkv, D), fp32, bf16 or fp16, H a multiple of Hkv;
//   CpOptions: causal, padding (valid_len), documents (cu_seqlens); usp also softmax const-max
//   (its ring part). ulysses_mode strict needs H divisible by the Ulysses degree and equal shards
//   in each group (check_strategy_shape); uaa takes any S and H.
// Returns: the state of the own queries, out (B, n_r, H, D) and lse (B, n_r, H), fp32; with
//   CpOptions::out_dtype the inputs' dtype, out in it (the fp32 result rounded once, before the
//   send), and without CpOptions::lse no lse; *stats set.
// Steps on member r of a Ulysses group of N (n_i tokens on member i, S_g = Σ n_i):
//   step 0: all_gather the token counts (8 bytes each); they must match the partition
//   step 1: one all_to_allv of q, k and v: [B, n_r, H, D] -> [B, S_g, |heads_r|, D]  (sequence ->
//           heads)
//           member j receives the query head slots [j·⌈H/N⌉, (j+1)·⌈H/N⌉) clipped to H and the
//           kv heads they read (h / (H/Hkv): disjoint when Hkv divides by N, else replicated),
//           expanded locally to one kv head per query head when the kernel's GQA rule on the
//           local heads would not find them
//   step 2: attention of the local heads over the whole group sequence (keys at the gathered
//           positions, so masks follow global positions for every layout)
//   step 3: one all_to_allv of out (and lse) back: [B, S_g, |heads_r|, .] -> [B, n_r, H, .]
// usp (U = ulysses_degree, R = ring_degree, N = U·R; group g: ranks g·U .. g·U+U-1): steps 0, 1
//   and 3 in the Ulysses group; step 2 is ring_over_blocks (ring.cc) across the R members with
//   the same Ulysses rank, each block one group's whole sequence of this member's kv heads.
// What each member holds (s_i: the tokens of member i; H_j: member j's head slots), N = 4:
//   ulysses   member 0         member 1         member 2         member 3
//   start     s_0, all heads   s_1, all heads   s_2, all heads   s_3, all heads
//   1         s_0..s_3, H_0    s_0..s_3, H_1    s_0..s_3, H_2    s_0..s_3, H_3
//   3         s_0, all heads   s_1, all heads   s_2, all heads   s_3, all heads
//   usp U = 2, R = 2 (G_g: group g's sequence; ring members {0, 2} and {1, 3}):
//   1         G_0, H_0         G_0, H_1         G_1, H_0         G_1, H_1
//   ring 0    G_0, H_0         G_0, H_1         G_1, H_0         G_1, H_1
//   ring 1    G_1, H_0         G_1, H_1         G_0, H_0         G_0, H_1
// Bytes per member (q_j, kv_j: query and kv heads of member j; e: input element size; o: output
// element size, 4 or e; l: 4 with the lse, else 0):
//   sent     Σ_{j≠r} B·n_r·(q_j + 2·kv_j)·D·e + Σ_{j≠r} B·n_j·q_r·(D·o + l) + 8·(N-1)
//   received Σ_{j≠r} B·n_j·(q_r + 2·kv_r)·D·e + Σ_{j≠r} B·n_r·q_j·(D·o + l) + 8·(N-1)
//   usp: these within the group, plus the ring's t_u·(S - S_{g+1}) sent and t_u·(S - S_g)
//   received, t_u = 2·B·kv_u·D·e (kv_u: the kv heads its ring carries).
// Memory: the whole group sequence of the local kv heads (CpStats::peak_kv_bytes), plus the
//   local query heads' q and state over it; usp: one group's sequence plus the ring's two
//   receive slots.
// Limitations: no overlap of the all-to-alls with compute; at most ⌈H/N⌉ heads per member, so
//   with H < N (or padded head slots) some members idle; kv heads that do not divide by N are
//   sent to several members; strict usp needs every ring group's sequence of one length.
#include <cstring>
#include <tuple>
#include <vector>

#include "schedule_build.h"
#include "seqpar/core/param_error.h"
#include "seqpar/core/timer.h"
#include "strategy_common.h"

namespace seqpar {

namespace {

// x (B, T, Hx, W), any strides but a contiguous W -> the copy of heads [h0, h1):
// (B, T, h1-h0, W), appended to out.
void append_heads(const TensorView& x, int64_t h0, int64_t h1, int64_t w_bytes, char*& out) {
  const size_t esz = dtype_size(x.dtype());
  const char* base = static_cast<const char*>(x.raw());
  const int64_t sb = x.stride(0) * esz, st = x.stride(1) * esz, sh = x.stride(2) * esz;
  const size_t chunk = static_cast<size_t>((h1 - h0) * w_bytes);
  if (chunk == 0) return;
  for (int64_t b = 0; b < x.dim(0); ++b)
    for (int64_t t = 0; t < x.dim(1); ++t) {
      const char* row = base + b * sb + t * st + h0 * sh;
      if (sh == w_bytes) {  // the heads adjacent: one copy
        std::memcpy(out, row, chunk);
        out += chunk;
        continue;
      }
      for (int64_t h = h0; h < h1; ++h, out += w_bytes)
        std::memcpy(out, row + (h - h0) * sh, w_bytes);
    }
}

// What one all_to_allv carries for one tensor: member j gets heads heads[j] of x (its W
// contiguous).
struct HeadsOf {
  TensorView x;
  std::span<const IndexRange> heads;
};

// Sequence -> heads, every tensor in one all_to_allv. Each xs[t].x (B, n_me, H_t, W_t), one dtype:
// member j gets heads xs[t].heads[j]. Returns per tensor (B, S_g, |xs[t].heads[me]|, W_t) with
// the tokens of member 0, then 1, ... (counts[i] each). Member i's message to j: for each tensor
// in order, its B·n_i rows of j's heads.
std::vector<Tensor> seq_to_heads(Communicator& comm, std::span<const HeadsOf> xs,
                                 std::span<const int64_t> counts) {
  const int n = comm.size(), me = comm.rank();
  const DType dt = xs[0].x.dtype();
  const int64_t B = xs[0].x.dim(0);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<int64_t> w_bytes, mine;  // per tensor
  for (const HeadsOf& t : xs) {
    w_bytes.push_back(t.x.dim(3) * static_cast<int64_t>(dtype_size(dt)));
    mine.push_back(t.heads[me].size());
  }
  std::vector<size_t> send_counts(n, 0), recv_counts(n, 0);
  for (int j = 0; j < n; ++j)
    for (size_t t = 0; t < xs.size(); ++t) {
      send_counts[j] += static_cast<size_t>(B * counts[me] * xs[t].heads[j].size() * w_bytes[t]);
      recv_counts[j] += static_cast<size_t>(B * counts[j] * mine[t] * w_bytes[t]);
    }
  size_t send_bytes = 0, recv_bytes = 0;
  for (int j = 0; j < n; ++j) send_bytes += send_counts[j], recv_bytes += recv_counts[j];
  std::vector<char> send(send_bytes), recv(recv_bytes);
  char* p = send.data();
  for (int j = 0; j < n; ++j)
    for (size_t t = 0; t < xs.size(); ++t)
      append_heads(xs[t].x, xs[t].heads[j].begin, xs[t].heads[j].end, w_bytes[t], p);
  comm.all_to_allv(send.data(), send_counts, recv.data(), recv_counts);
  // recv holds [member i][tensor t][B][n_i]; place each at [B][member i's tokens] of tensor t.
  std::vector<Tensor> out;
  for (size_t t = 0; t < xs.size(); ++t)
    out.emplace_back(std::vector<int64_t>{B, total, mine[t], xs[t].x.dim(3)}, dt);
  const char* src = recv.data();
  int64_t offset = 0;
  for (int i = 0; i < n; ++i) {
    for (size_t t = 0; t < xs.size(); ++t) {
      const size_t row = static_cast<size_t>(mine[t] * w_bytes[t]);
      if (row == 0 || counts[i] == 0) continue;  // no heads here, or no tokens there
      char* dst = static_cast<char*>(out[t].raw());
      for (int64_t b = 0; b < B; ++b) {
        std::memcpy(dst + (b * total + offset) * row, src, counts[i] * row);
        src += counts[i] * row;
      }
    }
    offset += counts[i];
  }
  return out;
}

// Heads -> sequence in one all_to_allv: the local state (out (B, S_g, |ranges[me]|, D) and lse
// (B, S_g, |ranges[me]|), fp32, over the group's tokens) -> out (B, n_me, H, D) in out_dtype
// (rounded once as it is packed) and, when `with_lse`, lse (B, n_me, H) fp32, with member j's heads
// at ranges[j]. Member i's message to j: j's B·n_j rows of i's heads, out then lse.
AttnState heads_to_seq(Communicator& comm, const AttnState& y, std::span<const int64_t> counts,
                       std::span<const IndexRange> ranges, int64_t heads, DType out_dtype,
                       bool with_lse) {
  const int n = comm.size(), me = comm.rank();
  const int64_t B = y.out.dim(0), total = y.out.dim(1), mine = y.out.dim(2), D = y.out.dim(3);
  const size_t oe = dtype_size(out_dtype);
  // Per head: D output elements, then (with the lse) one fp32.
  auto row_bytes = [&](int64_t h) {
    return static_cast<size_t>(h) * (D * oe + (with_lse ? sizeof(float) : 0));
  };
  std::vector<size_t> send_counts(n), recv_counts(n);
  size_t recv_bytes = 0;
  for (int j = 0; j < n; ++j) {
    send_counts[j] = static_cast<size_t>(B * counts[j]) * row_bytes(mine);
    recv_counts[j] = static_cast<size_t>(B * counts[me]) * row_bytes(ranges[j].size());
    recv_bytes += recv_counts[j];
  }
  // Send buffer in member order: [member i][out: B, n_i rows][lse: B, n_i rows].
  std::vector<char> send(static_cast<size_t>(B * total) * row_bytes(mine)), recv(recv_bytes);
  {
    char* dst = send.data();
    int64_t offset = 0;
    for (int i = 0; i < n; ++i) {
      for (const auto& [t, w, e] :
           {std::tuple{&y.out, mine * D, out_dtype}, {&y.lse, with_lse ? mine : 0, DType::kF32}})
        for (int64_t b = 0; b < B && w > 0 && counts[i] > 0; ++b) {
          const size_t elems = static_cast<size_t>(counts[i] * w);
          convert(t->data<float>() + (b * total + offset) * w, DType::kF32, dst, e, elems);
          dst += elems * dtype_size(e);
        }
      offset += counts[i];
    }
  }
  comm.all_to_allv(send.data(), send_counts, recv.data(), recv_counts);
  // recv holds [member j][out: B·n_me rows of |ranges[j]| heads][lse: likewise]; place each at
  // its heads.
  AttnState out;
  out.out = Tensor({B, counts[me], heads, D}, out_dtype);
  if (with_lse) out.lse = Tensor({B, counts[me], heads});
  const char* src = recv.data();
  for (int j = 0; j < n; ++j) {
    const int64_t h = ranges[j].size();
    for (const auto& [t, w] : {std::pair{&out.out, D}, {&out.lse, int64_t{1}}}) {
      if (t->ndim() == 0) continue;  // no lse
      const size_t e = dtype_size(t->dtype());
      const size_t chunk = static_cast<size_t>(h * w) * e;
      char* dst = static_cast<char*>(t->raw());
      for (int64_t r = 0; r < B * counts[me] && chunk > 0; ++r) {
        std::memcpy(dst + static_cast<size_t>((r * heads + ranges[j].begin) * w) * e, src, chunk);
        src += chunk;
      }
    }
  }
  return out;
}

// Token counts of the group, checked against what every member actually holds.
std::vector<int64_t> exchange_counts(Communicator& comm, std::span<const int64_t> expected,
                                     int64_t mine) {
  std::vector<int64_t> counts(comm.size());
  comm.all_gather(&mine, sizeof(mine), counts.data());
  for (int i = 0; i < comm.size(); ++i)
    SEQPAR_ARG_CHECK(counts[i] == expected[i], "ulysses: member ", i, " holds ", counts[i],
                     " tokens but the partition gives it ", expected[i]);
  return counts;
}

// k/v (B, T, h_kv, D) for query heads q (local kv heads kv): if the kernel's GQA rule
// (local head i reads local kv head i / (hq/hkv)) does not give each query head its kv head,
// expands to one kv head per query head.
Tensor kv_for_heads(const Tensor& x, IndexRange q, IndexRange kv, int64_t group) {
  const int64_t hq = q.size(), hkv = kv.size();
  if (standard_gqa(q, kv, group)) return x;
  const int64_t B = x.dim(0), T = x.dim(1), D = x.dim(3);
  const size_t w = static_cast<size_t>(D) * dtype_size(x.dtype());
  Tensor out({B, T, hq, D}, x.dtype());
  const char* src = static_cast<const char*>(x.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t t = 0; t < B * T; ++t)
    for (int64_t i = 0; i < hq; ++i)
      std::memcpy(dst + (t * hq + i) * w, src + (t * hkv + (q.begin + i) / group - kv.begin) * w, w);
  return out;
}

struct UlyssesLayout {
  std::vector<int64_t> expected;   // tokens per member, from the partition
  std::vector<int64_t> positions;  // the group's positions, member order
  std::vector<IndexRange> q_heads, kv_heads;
};

UlyssesLayout ulysses_layout(const Partition& part, int first_rank, int n, int64_t heads,
                             int64_t kv_heads) {
  UlyssesLayout l;
  for (int j = 0; j < n; ++j) {
    l.expected.push_back(part.count(first_rank + j));
    auto p = part.positions(first_rank + j);
    l.positions.insert(l.positions.end(), p.begin(), p.end());
    l.q_heads.push_back(ulysses_q_heads(heads, n, j));
    l.kv_heads.push_back(ulysses_kv_heads(heads, kv_heads, n, j));
  }
  return l;
}

// The common body: Ulysses exchange in `ucomm` (members first_rank.. of part), then `attend`
// on the local heads, then the exchange back.
template <typename Attend>
AttnState ulysses_body(Communicator& ucomm, const Partition& part, int first_rank,
                       const TensorView& q, const TensorView& k, const TensorView& v,
                       const CpOptions& opts, CpStats* stats, Attend&& attend) {
  const int n = ucomm.size(), me = ucomm.rank();
  const int64_t B = q.dim(0), H = q.dim(2), Hkv = k.dim(2), D = q.dim(3);
  UlyssesLayout l = ulysses_layout(part, first_rank, n, H, Hkv);
  double t0 = now_seconds();
  std::vector<int64_t> counts = exchange_counts(ucomm, l.expected, q.dim(1));
  // q, k and v are read where they lie as they are packed for the exchange.
  Tensor keep[3];
  const HeadsOf qkv[] = {{q.last_dim_dense(keep[0]), l.q_heads},
                         {k.last_dim_dense(keep[1]), l.kv_heads},
                         {v.last_dim_dense(keep[2]), l.kv_heads}};
  std::vector<Tensor> local_qkv = seq_to_heads(ucomm, qkv, counts);
  Tensor ql = std::move(local_qkv[0]), kl = std::move(local_qkv[1]), vl = std::move(local_qkv[2]);
  double t1 = now_seconds();
  const IndexRange myq = l.q_heads[me], mykv = l.kv_heads[me];
  AttnState local;
  if (myq.size() > 0) {
    kl = kv_for_heads(kl, myq, mykv, H / Hkv);
    vl = kv_for_heads(vl, myq, mykv, H / Hkv);
    local = attend(ql, kl, vl, l.positions);
  } else {
    local = AttnState::empty(B, ql.dim(1), 0, D);
  }
  double t2 = now_seconds();
  AttnState out = heads_to_seq(ucomm, local, counts, l.q_heads, H, opts.out_dtype, opts.lse);
  double t3 = now_seconds();
  if (stats) {
    stats->wait_seconds += (t1 - t0) + (t3 - t2);
    stats->peak_kv_bytes = std::max<int64_t>(stats->peak_kv_bytes, kl.nbytes() + vl.nbytes());
    // Storage of the resharded K/V (none on a member without query heads).
    auto held = [](const Tensor& t) {
      return static_cast<int64_t>(t.empty() || t.is_borrowed() ? t.nbytes() : t.capacity_bytes());
    };
    stats->measured_kv_bytes = std::max(stats->measured_kv_bytes, held(kl) + held(vl));
  }
  return out;
}

}  // namespace

AttnState ulysses_attention(Communicator& comm, const Partition& part, const TensorView& q,
                            const TensorView& k, const TensorView& v, const CpOptions& opts,
                            CpStats* stats) {
  validate_local_shapes(comm, part, q, k, v);
  check_strategy_shape(Strategy::kUlysses, part, q.dim(2), k.dim(2), comm.size(), opts);
  if (stats) *stats = CpStats{};
  return ulysses_body(comm, part, 0, q, k, v, opts, stats,
                      [&](const Tensor& ql, const Tensor& kl, const Tensor& vl,
                          std::span<const int64_t> pos) {
                        double t0 = now_seconds();
                        KernelCall call(opts, pos, pos, ql.dim(0));
                        const AttnParams& params = call.params;
                        AttnState s = flash_attention(ql, kl, vl, params);
                        if (stats) {
                          stats->work += visible_score_elements(ql.dim(0), ql.dim(2), ql.dim(1),
                                                                kl.dim(1), params.mask);
                          stats->compute_seconds += now_seconds() - t0;
                        }
                        return s;
                      });
}

AttnState usp_attention(SpComms& comms, const Partition& part, const TensorView& q,
                        const TensorView& k, const TensorView& v, const CpOptions& opts,
                        CpStats* stats) {
  Communicator& sp = comms.sp();
  validate_local_shapes(sp, part, q, k, v);
  const int u = comms.ulysses_degree(), groups = comms.ring_degree();
  check_strategy_shape(Strategy::kUsp, part, q.dim(2), k.dim(2), u, opts);
  const int group = sp.rank() / u;
  if (stats) *stats = CpStats{};
  // Every group's sequence (its members' positions), the ring's blocks.
  std::vector<std::vector<int64_t>> group_pos(groups);
  for (int g = 0; g < groups; ++g)
    for (int j = 0; j < u; ++j) {
      auto p = part.positions(g * u + j);
      group_pos[g].insert(group_pos[g].end(), p.begin(), p.end());
    }
  std::vector<std::span<const int64_t>> blocks(groups);
  for (int g = 0; g < groups; ++g) blocks[g] = group_pos[g];
  return ulysses_body(comms.ulysses(), part, group * u, q, k, v, opts, stats,
                      [&](const Tensor& ql, const Tensor& kl, const Tensor& vl,
                          std::span<const int64_t> pos) {
                        return ring_over_blocks(comms.ring(), blocks, pos, ql, kl, vl, opts,
                                                stats);
                      });
}

// ---- joint attention with the text split by head ---------------------------------------------

JointState ulysses_joint_attention(Strategy strategy, SpComms& comms, const Partition& part,
                                   const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& text_q, const Tensor& text_k, const Tensor& text_v,
                                   const CpOptions& opts, CpStats* stats) {
  SEQPAR_PARAM_CHECK(strategy == Strategy::kUlysses || strategy == Strategy::kUsp, "strategy",
                     "ulysses, usp",
                     "text split by head needs a Ulysses group: ", param("strategy"),
                     " ulysses or usp, not ", strategy_name(strategy));
  SEQPAR_ARG_CHECK(!opts.causal && opts.cu_seqlens.empty(),
                   "joint attention (text tokens) is bidirectional, without documents");
  Communicator& sp = comms.sp();
  validate_local_shapes(sp, part, q, k, v);
  const int u = comms.ulysses_degree(), groups = comms.ring_degree();
  check_strategy_shape(strategy, part, q.dim(2), k.dim(2), u, opts);
  const int me = comms.ulysses().rank(), group = sp.rank() / u;
  const int64_t B = q.dim(0), H = q.dim(2), Hkv = k.dim(2), D = q.dim(3), T = text_q.dim(1);
  const IndexRange myq = ulysses_q_heads(H, u, me), mykv = ulysses_kv_heads(H, Hkv, u, me);
  SEQPAR_ARG_CHECK(text_q.ndim() == 4 && text_q.dim(0) == B && text_q.dim(2) == myq.size() &&
                       text_q.dim(3) == D && text_k.ndim() == 4 &&
                       text_k.shape() == text_v.shape() && text_k.dim(0) == B &&
                       text_k.dim(1) == T && text_k.dim(2) == mykv.size() && text_k.dim(3) == D,
                   "text q ", text_q.shape_str(), ", k ", text_k.shape_str(), ", v ",
                   text_v.shape_str(), " must hold Ulysses member ", me, "'s heads: (", B, ", T, ",
                   myq.size(), ", ", D, ") and (", B, ", T, ", mykv.size(), ", ", D, ")");
  if (stats) *stats = CpStats{};
  std::vector<int64_t> text_pos(T);
  for (int64_t t = 0; t < T; ++t) text_pos[t] = part.seq() + t;
  CpOptions text_keys = opts;  // text keys are never padding
  text_keys.valid_len = 0;
  // Every ring group's sequence (usp: the ring's blocks).
  std::vector<std::vector<int64_t>> group_pos(groups);
  for (int g = 0; g < groups; ++g)
    for (int j = 0; j < u; ++j) {
      auto p = part.positions(g * u + j);
      group_pos[g].insert(group_pos[g].end(), p.begin(), p.end());
    }
  std::vector<std::span<const int64_t>> blocks(groups);
  for (int g = 0; g < groups; ++g) blocks[g] = group_pos[g];
  const Tensor tk = myq.size() > 0 ? kv_for_heads(text_k, myq, mykv, H / Hkv) : text_k;
  const Tensor tv = myq.size() > 0 ? kv_for_heads(text_v, myq, mykv, H / Hkv) : text_v;

  AttnState text;  // this member's heads
  JointState js;
  js.image = ulysses_body(
      comms.ulysses(), part, group * u, q, k, v, opts, stats,
      [&](const Tensor& ql, const Tensor& kl, const Tensor& vl, std::span<const int64_t> pos) {
        // The image queries over every image key, then over the text keys of these heads.
        AttnState s;
        if (strategy == Strategy::kUsp) {
          s = ring_over_blocks(comms.ring(), blocks, pos, ql, kl, vl, opts, stats);
        } else {
          KernelCall call(opts, pos, pos, B);
          s = flash_attention(ql, kl, vl, call.params);
        }
        const double t0 = now_seconds();
        {
          KernelCall call(text_keys, pos, text_pos, B);
          flash_attention_fold(s, ql, tk, tv, call.params);
        }
        // The text queries over the group's image sequence (all of it under Ulysses).
        {
          KernelCall call(opts, text_pos, pos, B);
          text = fully_hidden(opts, text_pos, pos) ? AttnState::empty(B, T, myq.size(), D)
                                                   : flash_attention(text_q, kl, vl, call.params);
        }
        if (stats) stats->compute_seconds += now_seconds() - t0;
        return s;
      });
  if (myq.size() == 0) text = AttnState::empty(B, T, 0, D);
  const double t1 = now_seconds();
  if (groups > 1 && myq.size() > 0) {  // usp: the other groups' image keys, by ring member
    const int64_t w = packed_row_floats(myq.size(), D);
    std::vector<float> mine(static_cast<size_t>(B * T * w));
    pack_partial_rows(text, 0, B * T, mine.data());
    std::vector<float> all(mine.size() * groups);
    comms.ring().all_gather(mine.data(), mine.size() * sizeof(float), all.data());
    text = merge_packed_partials(all.data(), groups, B, T, myq.size(), D);
  }
  const double t2 = now_seconds();
  if (myq.size() > 0) {
    KernelCall call(text_keys, text_pos, text_pos, B);
    flash_attention_fold(text, text_q, tk, tv, call.params);
  }
  js.text = std::move(text);
  if (stats) {
    stats->wait_seconds += t2 - t1;
    stats->compute_seconds += now_seconds() - t2;
    const int64_t hq = myq.size();
    // Image over text and text over image on this member's heads (its ring group's share of the
    // image for usp), text over text once per head (on the first ring group).
    stats->work += B * hq * (static_cast<int64_t>(group_pos[group].size()) * T * 2);
    stats->work += group == 0 ? B * hq * T * T : 0;
  }
  return js;
}

// ---- schedule -------------------------------------------------------------------------------

namespace {

// An all_to_allv of group `members` where member i sends member j bytes(i, j).
template <typename Bytes>
Step exchange_step(const std::string& what, GroupMembers members, int me, int64_t calls,
                   Bytes&& bytes) {
  Step step = collective_step(OpKind::kAllToAll, true, what, CommGroup::kUlysses, members, 0, 0);
  Transfer& t = *step.comm;
  t.calls = calls;
  for (int j = 0; j < static_cast<int>(members.size()); ++j) {
    if (j == me) continue;
    const PeerBytes p{members[j], bytes(me, j), bytes(j, me)};
    t.sent += p.sent;
    t.recv += p.recv;
    t.peers.push_back(p);
  }
  return step;
}

}  // namespace

// Per group of u consecutive members: token counts, q, k and v to heads in one call (then packing
// and placing them: a copy of what was sent and received), attention on the member's heads (the
// whole group sequence, or with several groups a ring of the groups' sequences across the members
// of one Ulysses rank), out (fp32 or the inputs' dtype) and the lse (when kept) back in one call,
// and their copy.
void add_ulysses(Schedule& s, const CallRuns& c, int u, SoftmaxMode softmax) {
  const int groups = c.n() / u;
  std::vector<IndexRange> qh(u), kvh(u);
  std::vector<int64_t> kernel_kv(u);
  for (int j = 0; j < u; ++j) {
    qh[j] = ulysses_q_heads(c.H, u, j);
    kvh[j] = ulysses_kv_heads(c.H, c.Hkv, u, j);
    kernel_kv[j] = ulysses_kernel_kv_heads(c.H, c.Hkv, u, j);
  }
  std::vector<PositionRuns> group_runs(groups);
  std::vector<int64_t> group_len(groups, 0);
  for (int r = 0; r < c.n(); ++r) {
    group_runs[r / u].insert(group_runs[r / u].end(), c.q[r].begin(), c.q[r].end());
    group_len[r / u] += run_count(c.q[r]);
  }
  const double e = static_cast<double>(c.e);
  for (int g = 0; g < groups && u > 1; ++g) {
    const GroupMembers members = consecutive_members(g * u, u);
    auto count = [&](int j) { return run_count(c.q[g * u + j]); };
    for (int me = 0; me < u; ++me) {
      std::vector<Step>& steps = s.ranks[members[me]].steps;
      steps.push_back(collective_step(OpKind::kAllGather, false, "token counts",
                                      CommGroup::kUlysses, members, 8ull * (u - 1),
                                      8ull * (u - 1)));
      steps.push_back(exchange_step("q, k, v", members, me, 1, [&](int from, int to) {
        return static_cast<uint64_t>(c.B * count(from) * (qh[to].size() + 2 * kvh[to].size()) *
                                     c.D * e);
      }));
      steps.push_back(
          compute_step(0, static_cast<double>(steps.back().comm->sent + steps.back().comm->recv)));
    }
  }
  if (groups == 1) {
    for (int j = 0; j < u; ++j) {
      RankSchedule& rs = s.ranks[j];
      rs.steps.push_back(
          compute_step(c.B * qh[j].size() * c.visible(group_runs[0], group_runs[0])));
      rs.peak_kv_bytes = 2 * c.B * c.seq * (qh[j].size() > 0 ? kernel_kv[j] : 0) * c.D * c.e;
    }
  } else {
    for (int j = 0; j < u; ++j) {
      if (qh[j].size() == 0) continue;  // a member without query heads runs no ring
      add_ring(s, c, GroupMembers{j, u, groups}, group_runs, group_runs, qh[j].size(), kernel_kv[j],
               CommGroup::kRing, softmax);
    }
  }
  for (int g = 0; g < groups && u > 1; ++g) {
    const GroupMembers members = consecutive_members(g * u, u);
    for (int me = 0; me < u; ++me) {
      std::vector<Step>& steps = s.ranks[members[me]].steps;
      // member `from` sends member `to` the rows of to's tokens of from's heads
      steps.push_back(
          exchange_step(c.lse ? "out, lse" : "out", members, me, 1, [&](int from, int to) {
            return static_cast<uint64_t>(c.B * run_count(c.q[g * u + to]) * qh[from].size() *
                                         (c.D * c.out_e + (c.lse ? 4 : 0)));
          }));
      steps.push_back(
          compute_step(0, static_cast<double>(steps.back().comm->sent + steps.back().comm->recv)));
    }
  }
}

Schedule ulysses_schedule(const ParallelConfig& cfg, const AttnShape& shape) {
  const CallRuns c = sequence_runs(cfg, shape);
  Schedule s = empty_schedule(c);
  add_ulysses(s, c, c.n(), SoftmaxMode::kOnline);
  return s;
}

Schedule usp_schedule(const ParallelConfig& cfg, const AttnShape& shape) {
  const CallRuns c = sequence_runs(cfg, shape);
  Schedule s = empty_schedule(c);
  add_ulysses(s, c, cfg.mesh.ulysses, cfg.softmax);
  return s;
}

}  // namespace seqpar
