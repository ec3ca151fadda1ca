// Ring attention over 4 thread ranks, checked against single-rank attention (README "Use it
// from C++"). Exits 0 if they agree.
#include <cstdio>
#include <seqpar/comm/threads.h>
#include <seqpar/parallel/strategies.h>
#include <seqpar/version.h>

int main() {
  using namespace seqpar;
  const int64_t S = 256, H = 4, D = 32;
  const Tensor q = random_normal({1, S, H, D}, 1), k = random_normal({1, S, H, D}, 2),
               v = random_normal({1, S, H, D}, 3);
  const Partition part(S, 4, Layout::kZigzag);
  const CpOptions opts{.causal = true};
  std::vector<Tensor> outs(4);
  ThreadWorld::run(4, [&](Communicator& comm) {
    SpComms comms(comm);
    const int r = comm.rank();
    outs[r] = context_parallel_attention(Strategy::kRing, comms, part, shard(q, part, r),
                                         shard(k, part, r), shard(v, part, r), opts).out;
  });
  AttnParams params;
  params.mask.causal = true;
  const double err = max_abs_diff(unshard(outs, part), flash_attention(q, k, v, params).out);
  std::printf("seqpar %s: ring attention on 4 ranks, max |err| %.2g\n", SEQPAR_VERSION_STRING, err);
  return err < 1e-5 ? 0 : 1;
}
