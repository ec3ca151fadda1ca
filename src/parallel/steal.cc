// ring with schedule steal: see strategies.h and docs/algorithms.md "steal".
#include "schedule_build.h"
#include "strategy_common.h"

namespace seqpar {

AttnState steal_attention(Communicator&, const Partition&, const Tensor&, const Tensor&,
                          const Tensor&, const CpOptions&, CpStats*) {
  throw InvalidArgument("schedule 'steal' is not available yet");
}

Schedule steal_schedule(const ParallelConfig&, const AttnShape&) {
  throw InvalidArgument("schedule 'steal' is not available yet");
}

}  // namespace seqpar
