// passq and passkv over a distributed K/V cache (docs/algorithms.md "passq and passkv"), with
// what they share: the cache's placement (decode_placement, request_runs), the partial rows
// packed for the all-to-all (also ring pass-Q's, passq_ring.cc) and Meta's pass-KV / pass-Q rule
// (pass_choice).
//
// Accepts: a KvPlacement: rank i holds the K/V of its share of the P cached tokens and of its
//   new tokens (kv_pos[i]; k, v (B, K_i, Hkv, D)) and the queries of its new tokens (q_pos[i];
//   q (B, T_i, H, D), T_i possibly 0), fp32, bf16 or fp16; CpOptions: causal, documents
//   (cu_seqlens: packed requests).
// Returns: the state of the own new tokens over the whole cache, out (B, T_r, H, D) and
//   lse (B, T_r, H), fp32; *stats reset.
//
// passq on rank r of N (T = Σ T_i):
//   step 0: all_gatherv the queries: (B, T_i, H, D) from each rank -> (B, T, H, D)
//   step 1: attend all T queries to the local K/V shard -> partial state (B, T, H, D) + lse
//   step 2: all_to_allv the partials (fp32): rank i gets the rows of its own queries from every
//           rank
//   step 3: merge the N partials of each own query by LSE (in rank order)
//   Q blocks held (q_i: the queries of rank i), N = 4:
//     step     rank 0             rank 1             rank 2             rank 3
//     start    q0                 q1                 q2                 q3
//     0        q0 q1 q2 q3        q0 q1 q2 q3        q0 q1 q2 q3        q0 q1 q2 q3
//     2        q0 x ranks 0..3    q1 x ranks 0..3    q2 x ranks 0..3    q3 x ranks 0..3
//   bytes: sent B·T_r·H·D·e·(N-1) + B·(T - T_r)·H·(D+1)·4,
//          received B·(T - T_r)·H·D·e + B·T_r·H·(D+1)·4·(N-1)
//   memory: the own K/V shard (CpStats::peak_kv_bytes); the gathered queries, staged then
//   regrouped (2·B·T·H·D·e); the partial state of all T queries and its packed copy
//   (2·B·T·H·(D+1)·4); the N received partials of the own queries (N·B·T_r·H·(D+1)·4).
//
// passkv: ring_over_blocks (ring.cc) with the K/V shards as blocks and the queries staying: at
//   step s rank r holds the K/V of rank r-s (ring.cc's table); bytes sent t·(K - K_{r+1}),
//   received t·(K - K_r), with t = 2·B·Hkv·D·e, K_i the K/V tokens of rank i and K = P + T;
//   memory: the ring's (own shard plus two receive slots, none with zero copy).
//
// Limitations: online softmax only. passq moves every query before any attention starts (an
//   exposed transfer; ring pass-Q overlaps it); passkv moves the whole cache, which hides behind
//   the attention only for enough new tokens (pass_choice's rule; choose_cache_strategy replays
//   the schedules).
#include "seqpar/parallel/decode.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "schedule_build.h"
#include "seqpar/core/param_error.h"
#include "seqpar/core/timer.h"
#include "strategy_common.h"

namespace seqpar {


int64_t new_token_share(int64_t fresh, int ranks, int rank) {
  return fresh / ranks + (rank >= ranks - fresh % ranks ? 1 : 0);
}

KvPlacement decode_placement(int64_t cached, int64_t fresh, int ranks, Layout layout) {
  SEQPAR_PARAM_CHECK(cached >= ranks, "cached", detail::concat("at least ", ranks), param("cached"),
                     " ", cached, " is too small: each of the ", ranks,
                     " ranks needs at least one cached token");
  SEQPAR_PARAM_CHECK(fresh >= 1, "new", "at least 1", param("new"), " ", fresh,
                     " is invalid; it must be at least 1");
  Partition cache(cached, ranks, layout);
  KvPlacement p;
  p.kv_pos.resize(ranks);
  p.q_pos.resize(ranks);
  // New tokens: contiguous runs; the first ranks get the smaller share so that with T < N the
  // newest tokens sit on the last ranks.
  int64_t next = cached;
  for (int r = 0; r < ranks; ++r) {
    const int64_t share = new_token_share(fresh, ranks, r);
    for (int64_t i = 0; i < share; ++i) p.q_pos[r].push_back(next++);
    auto c = cache.positions(r);
    p.kv_pos[r].assign(c.begin(), c.end());
    p.kv_pos[r].insert(p.kv_pos[r].end(), p.q_pos[r].begin(), p.q_pos[r].end());
  }
  return p;
}

RequestRuns request_runs(std::span<const int64_t> cached_lens, std::span<const int64_t> fresh_lens,
                         int ranks, Layout layout) {
  SEQPAR_PARAM_CHECK(!cached_lens.empty() && cached_lens.size() == fresh_lens.size(), "cached_lens",
                     "", param("cached_lens"), " (", cached_lens.size(), ") and ",
                     param("fresh_lens"), " (", fresh_lens.size(),
                     ") must give one length per request, at least one request");
  SEQPAR_PARAM_CHECK(ranks >= 1, "ranks", "at least 1", param("ranks"), " ", ranks,
                     " is invalid; it must be at least 1");
  // Request i occupies [off_i, off_i + P_i + T_i): its cache split by `layout` (the caches as
  // pieces of piece_layout_runs), its new tokens split as decode_placement splits them.
  const size_t m = cached_lens.size();
  std::vector<int64_t> starts(m), offsets(m + 1, 0);
  for (size_t i = 0; i < m; ++i) {
    SEQPAR_PARAM_CHECK(cached_lens[i] >= 1 && fresh_lens[i] >= 1,
                       cached_lens[i] >= 1 ? "fresh_lens" : "cached_lens", "at least 1", "request ",
                       i, ": ", param("cached_lens"), " ", cached_lens[i], " and ",
                       param("fresh_lens"), " ", fresh_lens[i], " must both be at least 1");
    starts[i] = offsets[i];
    offsets[i + 1] = offsets[i] + cached_lens[i] + fresh_lens[i];
  }
  const std::vector<PositionRuns> cache = piece_layout_runs(starts, cached_lens, ranks, layout);
  RequestRuns out;
  out.q.resize(ranks);
  out.kv.resize(ranks);
  std::vector<size_t> next_piece(ranks, 0);  // cache runs of each rank, in request order
  for (size_t i = 0; i < m; ++i) {
    const int64_t t = fresh_lens[i];
    int64_t next = offsets[i] + cached_lens[i];
    for (int r = 0; r < ranks; ++r) {
      const std::vector<PositionRun>& own = cache[r];
      while (next_piece[r] < own.size() && own[next_piece[r]].start < offsets[i + 1])
        out.kv[r].push_back(own[next_piece[r]++]);
      const int64_t share = new_token_share(t, ranks, r);
      if (share > 0) {
        const PositionRun fresh{next, share, 1};
        out.q[r].push_back(fresh);
        out.kv[r].push_back(fresh);
      }
      next += share;
    }
  }
  for (int r = 0; r < ranks; ++r)
    SEQPAR_PARAM_CHECK(!out.kv[r].empty(), "ranks", "", "rank ", r, " of ", ranks,
                       " would hold no K/V token of the ", m, " requests (", param("cached_lens"),
                       ", ", param("fresh_lens"), "); use fewer ", param("ranks"),
                       " or longer caches");
  return out;
}

KvPlacement decode_placement(std::span<const int64_t> cached_lens,
                             std::span<const int64_t> fresh_lens, int ranks, Layout layout) {
  const RequestRuns rr = request_runs(cached_lens, fresh_lens, ranks, layout);
  KvPlacement p;
  p.kv_pos.resize(ranks);
  p.q_pos.resize(ranks);
  auto expand = [](const PositionRuns& runs, std::vector<int64_t>& pos) {
    for (const PositionRun& run : runs)
      for (int64_t i = 0; i < run.count; ++i) pos.push_back(run.start + i * run.stride);
    std::sort(pos.begin(), pos.end());
  };
  for (int r = 0; r < ranks; ++r) {
    expand(rr.q[r], p.q_pos[r]);
    expand(rr.kv[r], p.kv_pos[r]);
  }
  return p;
}

void pack_partial_rows(const AttnState& s, int64_t first, int64_t rows, float* dst) {
  const int64_t H = s.lse.dim(2), D = s.out.dim(3), w = packed_row_floats(H, D);
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(dst + i * w, s.out.data<float>() + (first + i) * H * D, H * D * sizeof(float));
    std::memcpy(dst + i * w + H * D, s.lse.data<float>() + (first + i) * H, H * sizeof(float));
  }
}

AttnState merge_packed_partials(const float* packed, int members, int64_t batch, int64_t tokens,
                                int64_t heads, int64_t head_dim) {
  const int64_t H = heads, D = head_dim, w = packed_row_floats(H, D), rows = batch * tokens;
  AttnState acc = AttnState::empty(batch, tokens, H, D);
  for (int i = 0; i < members; ++i) {
    const float* src = packed + static_cast<size_t>(i * rows * w);
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t h = 0; h < H; ++h)
        merge_row(acc.out.data<float>() + (row * H + h) * D, acc.lse.data<float>() + row * H + h,
                  src + row * w + h * D, src[row * w + H * D + h], D);
  }
  return acc;
}

void validate_placement(const Communicator& comm, const KvPlacement& place, const Tensor& q,
                        const Tensor& k, const Tensor& v) {
  const int r = comm.rank();
  SEQPAR_ARG_CHECK(place.ranks() == comm.size(), "placement has ", place.ranks(),
                   " ranks, the communicator ", comm.size());
  SEQPAR_ARG_CHECK(q.ndim() == 4 && k.ndim() == 4 && k.shape() == v.shape(),
                   "q must be (B, T, H, D) and k, v (B, K, Hkv, D) alike");
  SEQPAR_ARG_CHECK(q.dim(1) == static_cast<int64_t>(place.q_pos[r].size()) &&
                       k.dim(1) == static_cast<int64_t>(place.kv_pos[r].size()),
                   "rank ", r, " holds ", q.dim(1), " queries and ", k.dim(1),
                   " keys; the placement says ", place.q_pos[r].size(), " and ",
                   place.kv_pos[r].size());
  SEQPAR_PARAM_CHECK(q.dim(2) % k.dim(2) == 0, "kv_heads", divisors_text(q.dim(2)), param("heads"),
                     " ", q.dim(2), " not divisible by ", param("kv_heads"), " ", k.dim(2));
}

AttnState passq_attention(Communicator& comm, const KvPlacement& place, const Tensor& q,
                          const Tensor& k, const Tensor& v, const CpOptions& opts,
                          CpStats* stats) {
  validate_placement(comm, place, q, k, v);
  const int n = comm.size(), r = comm.rank();
  const int64_t B = q.dim(0), H = q.dim(2), D = q.dim(3);
  const size_t e = dtype_size(q.dtype());
  if (stats) *stats = CpStats{};

  // step 0: gather every rank's queries, [rank i][B][T_i] order, positions alike.
  std::vector<int64_t> counts(n);
  std::vector<int64_t> all_pos;
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    counts[i] = static_cast<int64_t>(place.q_pos[i].size());
    all_pos.insert(all_pos.end(), place.q_pos[i].begin(), place.q_pos[i].end());
    total += counts[i];
  }
  const size_t q_row = static_cast<size_t>(H * D) * e;
  std::vector<size_t> q_bytes(n);
  for (int i = 0; i < n; ++i) q_bytes[i] = static_cast<size_t>(B * counts[i]) * q_row;
  double t0 = now_seconds();
  Tensor staged({B * total, H, D}, q.dtype());
  comm.all_gatherv(q.raw(), staged.raw(), q_bytes);
  // Regroup to (B, T, H, D) with tokens in rank order.
  Tensor all_q({B, total, H, D}, q.dtype());
  {
    const char* src = static_cast<const char*>(staged.raw());
    char* dst = static_cast<char*>(all_q.raw());
    int64_t off = 0;
    for (int i = 0; i < n; ++i) {
      for (int64_t b = 0; b < B; ++b) {
        std::memcpy(dst + (b * total + off) * q_row, src, counts[i] * q_row);
        src += counts[i] * q_row;
      }
      off += counts[i];
    }
  }
  double t1 = now_seconds();

  // step 1: partial state of every query over the local shard.
  AttnState partial;
  if (total > 0 && k.dim(1) > 0) {
    KernelCall call(opts, all_pos, place.kv_pos[r], B);
    const AttnParams& params = call.params;
    partial = flash_attention(all_q, k, v, params);
    if (stats) stats->work = visible_score_elements(B, H, total, k.dim(1), params.mask);
  } else {
    partial = AttnState::empty(B, total, H, D);
  }
  double t2 = now_seconds();

  // step 2: rows of rank j's queries go to rank j; packed per destination as [B][T_j][H][D+1]
  // (out row then lse), fp32.
  const int64_t w = packed_row_floats(H, D);
  std::vector<size_t> send_counts(n), recv_counts(n);
  for (int j = 0; j < n; ++j) {
    send_counts[j] = static_cast<size_t>(B * counts[j] * w) * sizeof(float);
    recv_counts[j] = static_cast<size_t>(B * counts[r] * w) * sizeof(float);
  }
  std::vector<float> send(static_cast<size_t>(B * total * w));
  {
    float* dst = send.data();
    int64_t off = 0;
    for (int j = 0; j < n; ++j) {
      for (int64_t b = 0; b < B; ++b)
        {
          pack_partial_rows(partial, b * total + off, counts[j], dst);
          dst += counts[j] * w;
        }
      off += counts[j];
    }
  }
  std::vector<float> recv(static_cast<size_t>(n * B * counts[r] * w));
  comm.all_to_allv(send.data(), send_counts, recv.data(), recv_counts);
  double t3 = now_seconds();

  // step 3: merge, rank by rank.
  AttnState acc = merge_packed_partials(recv.data(), n, B, counts[r], H, D);
  if (stats) {
    stats->peak_kv_bytes = static_cast<int64_t>(k.nbytes() + v.nbytes());
    stats->measured_kv_bytes = stats->peak_kv_bytes;  // the own shard only
    stats->wait_seconds = (t1 - t0) + (t3 - t2);
    stats->compute_seconds = (t2 - t1) + (now_seconds() - t3);
  }
  return acc;
}

AttnState passkv_attention(Communicator& comm, const KvPlacement& place, const Tensor& q,
                           const Tensor& k, const Tensor& v, const CpOptions& opts,
                           CpStats* stats) {
  validate_placement(comm, place, q, k, v);
  std::vector<std::span<const int64_t>> blocks(place.ranks());
  for (int i = 0; i < place.ranks(); ++i) blocks[i] = place.kv_pos[i];
  if (stats) *stats = CpStats{};
  return ring_over_blocks(comm, blocks, place.q_pos[comm.rank()], q, k, v, opts, stats);
}

PassChoice pass_choice(int64_t new_tokens, int64_t cached_tokens, int ranks, int64_t heads,
                       int64_t kv_heads, size_t elem_bytes, double flops_per_s, double bytes_per_s,
                       double miss_threshold, std::string_view miss_threshold_formula) {
  PassChoice c;
  c.threshold_tokens = static_cast<double>(ranks) * flops_per_s * kv_heads * elem_bytes /
                       (2.0 * heads * bytes_per_s);
  c.miss_rate = static_cast<double>(new_tokens) / static_cast<double>(new_tokens + cached_tokens);
  c.miss_threshold = miss_threshold;
  const std::string formula(miss_threshold_formula);
  char buf[320];
  if (new_tokens >= c.threshold_tokens) {
    c.kind = Strategy::kPassKv;
    std::snprintf(buf, sizeof buf, "passkv: T = %lld new tokens >= N*C*Hkv*e/(2*H*BW) = %.0f",
                  static_cast<long long>(new_tokens), c.threshold_tokens);
  } else if (c.miss_rate >= c.miss_threshold) {
    c.kind = Strategy::kPassKv;
    std::snprintf(buf, sizeof buf, "passkv: T/(T+P) = %.4f >= %s = %.4f", c.miss_rate,
                  formula.c_str(), c.miss_threshold);
  } else {
    c.kind = Strategy::kPassQ;
    std::snprintf(buf, sizeof buf, "passq: T = %lld < %.0f tokens and T/(T+P) = %.4f < %s = %.4f",
                  static_cast<long long>(new_tokens), c.threshold_tokens, c.miss_rate,
                  formula.c_str(), c.miss_threshold);
  }
  c.reason = buf;
  return c;
}

PassChoice choose_pass(int64_t new_tokens, int64_t cached_tokens, int ranks, int64_t heads,
                       int64_t kv_heads, size_t elem_bytes, double flops_per_s,
                       double bytes_per_s) {
  return pass_choice(new_tokens, cached_tokens, ranks, heads, kv_heads, elem_bytes, flops_per_s,
                     bytes_per_s, 2.0 * kv_heads / heads, "2*Hkv/H");
}

// ---- schedules --------------------------------------------------------------------------------

// pass-Q: all_gatherv of the queries, attention of all of them over the local shard,
// all_to_allv of the fp32 partial states back to their owners, N merges of each own row.
void add_passq(Schedule& s, const CallRuns& c) {
  const int n = c.n();
  PositionRuns all_q;
  int64_t total = 0;
  for (const auto& q : c.q) {
    all_q.insert(all_q.end(), q.begin(), q.end());
    total += run_count(q);
  }
  const uint64_t q_token = c.B * c.H * c.D * c.e;
  const uint64_t partial = c.B * c.H * (c.D + 1) * 4;  // fp32 out row and lse of one token
  for (int r = 0; r < n; ++r) {
    RankSchedule& rs = s.ranks[r];
    const int64_t mine = rs.tokens;
    const GroupMembers members = consecutive_members(0, n);
    rs.steps.push_back(collective_step(OpKind::kAllGather, true, "q", CommGroup::kSp, members,
                                       q_token * mine * (n - 1), q_token * (total - mine)));
    rs.steps.push_back(compute_step(c.B * c.H * c.visible(all_q, c.kv[r])));
    Step back =
        collective_step(OpKind::kAllToAll, true, "partial out, lse", CommGroup::kSp, members, 0, 0);
    for (int j = 0; j < n; ++j) {
      if (j == r) continue;
      const PeerBytes p{j, partial * run_count(c.q[j]), partial * mine};
      back.comm->sent += p.sent;
      back.comm->recv += p.recv;
      back.comm->peers.push_back(p);
    }
    rs.steps.push_back(std::move(back));
    rs.steps.push_back(compute_step(0, n * c.merge_bytes(mine, c.H)));
    rs.peak_kv_bytes = 2 * c.B * run_count(c.kv[r]) * c.Hkv * c.D * c.e;
  }
}

Schedule passq_schedule(const ParallelConfig& cfg, const AttnShape& shape) {
  const CallRuns c = cache_runs(cfg, shape);
  Schedule s = empty_schedule(c);
  add_passq(s, c);
  return s;
}

// pass-KV: the ring of the K/V shards, the queries staying.
Schedule passkv_schedule(const ParallelConfig& cfg, const AttnShape& shape) {
  const CallRuns c = cache_runs(cfg, shape);
  Schedule s = empty_schedule(c);
  add_ring(s, c, consecutive_members(0, c.n()), c.kv, c.q, c.H, c.Hkv, CommGroup::kSp,
           SoftmaxMode::kOnline);
  return s;
}

CommPrediction predict_decode_bytes(Strategy kind, const KvPlacement& place, int rank,
                                    int64_t batch, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim, size_t elem_bytes) {
  const CallRuns c = placement_runs(place, batch, heads, kv_heads, head_dim, elem_bytes);
  Schedule s = empty_schedule(c);
  if (kind == Strategy::kPassQ) {
    add_passq(s, c);
  } else {
    add_ring(s, c, consecutive_members(0, c.n()), c.kv, c.q, c.H, c.Hkv, CommGroup::kSp,
             SoftmaxMode::kOnline);
  }
  return schedule_bytes(s, rank);
}

}  // namespace seqpar
