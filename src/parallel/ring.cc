// ring (pass-KV): K/V blocks travel around the ring while each rank computes on the block it
// holds; partial states merge by LSE. On member r of N, with next = r+1 and prev = r-1 (mod N):
//   step s (0 <= s < N), holding the block of member src = r - s:
//     1. if s < N-1: post irecv(prev) into the free buffer, isend(next) of the held block
//     2. attend q to the held block unless causal masking hides all of it; merge into acc
//     3. wait for both transfers; the received block (of member r-s-1) becomes the held block
// Buffers: the own block plus two receive buffers used alternately, so a buffer is refilled only
// after its send and its compute finished (the step before).
//
// softmax const-max (docs/algorithms.md "const-max ring"): before step 0, all-reduce (max) the
// largest key norm of every (batch, kv head) and bound every query row's logits by
// scale·|q|·max|k|. The first block attended runs with the online softmax and decides per row:
// fixed max (bound within 30 of its lse) or fallback. Every later step runs the kernel with the
// fixed max for the fixed rows, whose sums then add without rescaling (ConstMaxAccumulator).
#include <array>
#include <optional>
#include <vector>

#include "parallel/strategy_common.h"
#include "seqpar/core/timer.h"

namespace seqpar {

namespace {
constexpr int kTagK = 101;
constexpr int kTagV = 102;
}  // namespace

AttnState ring_over_blocks(Communicator& comm, std::span<const std::span<const int64_t>> block_pos,
                           std::span<const int64_t> q_pos, const Tensor& q, const Tensor& k,
                           const Tensor& v, const CpOptions& opts, CpStats* stats) {
  const int n = comm.size(), r = comm.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const int64_t B = q.dim(0), H = q.dim(2), D = q.dim(3), Hkv = k.dim(2);
  SEQPAR_CHECK(static_cast<int>(block_pos.size()) == n, "one block per ring member");
  SEQPAR_CHECK(k.dim(1) == static_cast<int64_t>(block_pos[r].size()), "own block size");

  AttnState acc = AttnState::empty(B, q.dim(1), H, D);
  std::array<Tensor, 2> buf_k, buf_v;
  const Tensor* cur_k = &k;
  const Tensor* cur_v = &v;
  int src = r;
  double compute = 0, wait = 0;
  int64_t work = 0;
  bool first = true;
  std::optional<ConstMaxAccumulator> cmax;
  if (opts.softmax == SoftmaxMode::kConstMax) {
    const double t = now_seconds();
    cmax.emplace(const_max_row_bounds(comm, q, k, block_pos[r], opts));
    wait += now_seconds() - t;
  }

  for (int step = 0; step < n; ++step) {
    std::array<Request, 4> reqs;
    const int incoming = (r + n - step - 1) % n;
    if (step + 1 < n) {
      Tensor& nk = buf_k[step % 2];
      Tensor& nv = buf_v[step % 2];
      const int64_t len = static_cast<int64_t>(block_pos[incoming].size());
      nk.resize({B, len, Hkv, D}, k.dtype());
      nv.resize({B, len, Hkv, D}, v.dtype());
      reqs[0] = comm.irecv(nk.raw(), nk.nbytes(), prev, kTagK);
      reqs[1] = comm.irecv(nv.raw(), nv.nbytes(), prev, kTagV);
      reqs[2] = comm.isend(cur_k->raw(), cur_k->nbytes(), next, kTagK);
      reqs[3] = comm.isend(cur_v->raw(), cur_v->nbytes(), next, kTagV);
    }

    const auto k_pos = block_pos[src];
    if (!fully_hidden(opts, q_pos, k_pos)) {
      double t0 = now_seconds();
      KernelCall call(opts, q_pos, k_pos, B);
      AttnParams& params = call.params;
      params.progress = [&reqs] {
        for (auto& rq : reqs) rq.test();
      };
      if (cmax && cmax->started()) cmax->prepare(params);
      AttnState part_state = flash_attention(q, *cur_k, *cur_v, params);
      if (cmax) {
        if (cmax->started()) {
          cmax->add(part_state);
        } else {
          cmax->start(std::move(part_state));
        }
      } else if (first) {
        acc = std::move(part_state);
        first = false;
      } else {
        merge_into(acc, part_state);
      }
      work += visible_score_elements(B, H, q.dim(1), cur_k->dim(1), params.mask);
      compute += now_seconds() - t0;
    }

    double t1 = now_seconds();
    wait_all(reqs);
    wait += now_seconds() - t1;
    if (step + 1 < n) {
      cur_k = &buf_k[step % 2];
      cur_v = &buf_v[step % 2];
      src = incoming;
    }
  }

  int64_t fallback = 0;
  if (cmax && cmax->started()) {
    const double t = now_seconds();
    fallback = cmax->fallback_rows();
    acc = cmax->finish();
    compute += now_seconds() - t;
  }
  if (stats) {
    stats->fallback_rows += fallback;
    int64_t kv = static_cast<int64_t>(k.nbytes() + v.nbytes());
    for (int i = 0; i < 2; ++i)
      kv += static_cast<int64_t>(buf_k[i].capacity_bytes() + buf_v[i].capacity_bytes());
    stats->peak_kv_bytes = std::max(stats->peak_kv_bytes, kv);
    stats->work += work;
    stats->compute_seconds += compute;
    stats->wait_seconds += wait;
  }
  return acc;
}

AttnState ring_attention(Communicator& comm, const Partition& part, const Tensor& q,
                         const Tensor& k, const Tensor& v, const CpOptions& opts,
                         CpStats* stats) {
  validate_local_shapes(comm, part, q, k, v);
  std::vector<std::span<const int64_t>> blocks(part.ranks());
  for (int i = 0; i < part.ranks(); ++i) blocks[i] = part.positions(i);
  if (stats) *stats = CpStats{};
  return ring_over_blocks(comm, blocks, part.positions(comm.rank()), q, k, v, opts, stats);
}

}  // namespace seqpar
