// passq with schedule ring: see decode.h and docs/algorithms.md "ring pass-Q".
#include "schedule_build.h"
#include "strategy_common.h"

namespace seqpar {

AttnState passq_ring_attention(Communicator&, const KvPlacement&, const Tensor&, const Tensor&,
                               const Tensor&, const CpOptions&, CpStats*) {
  throw InvalidArgument("schedule 'ring' of passq is not available yet");
}

Schedule passq_ring_schedule(const ParallelConfig&, const AttnShape&) {
  throw InvalidArgument("schedule 'ring' of passq is not available yet");
}

}  // namespace seqpar
