// Pieces shared by the strategy implementations (private to src/parallel/).
#pragma once

#include <span>

#include "seqpar/parallel/strategies.h"

namespace seqpar {

// Throws InvalidArgument if the local q/k/v do not fit this rank's share of the partition.
void validate_local_shapes(const Communicator& comm, const Partition& part, const Tensor& q,
                           const Tensor& k, const Tensor& v);

// Kernel parameters for queries at q_pos attending keys at k_pos under opts.
AttnParams kernel_params(const CpOptions& opts, std::span<const int64_t> q_pos,
                         std::span<const int64_t> k_pos);

}  // namespace seqpar
