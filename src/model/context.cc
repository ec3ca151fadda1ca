#include "seqpar/model/context.h"

#include <cstring>

#include "seqpar/core/param_error.h"

namespace seqpar {

std::array<Tensor, 2> cfg_branches(Communicator& cfg, const std::function<Tensor(int)>& branch) {
  SEQPAR_PARAM_CHECK(cfg.size() <= 2, "cfg", "", param("cfg"), " ", cfg.size(),
                     " is invalid; valid: 1, 2");
  if (cfg.size() == 1) return {branch(0), branch(1)};
  const Tensor mine = branch(cfg.rank());
  Tensor both({2, mine.numel()});
  cfg.all_gather(mine.raw(), mine.nbytes(), both.raw());
  std::array<Tensor, 2> v{Tensor(mine.shape()), Tensor(mine.shape())};
  std::memcpy(v[0].raw(), both.data<float>(), mine.nbytes());
  std::memcpy(v[1].raw(), both.data<float>() + mine.numel(), mine.nbytes());
  return v;
}

}  // namespace seqpar
