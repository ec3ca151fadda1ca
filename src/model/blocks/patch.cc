#include "seqpar/model/blocks/patch.h"

namespace seqpar {

Tensor patchify(const Tensor& latent, std::array<int64_t, 3> patch) {
  const int64_t B = latent.dim(0), C = latent.dim(1), F = latent.dim(2), H = latent.dim(3),
                W = latent.dim(4);
  const int64_t gf = F / patch[0], gh = H / patch[1], gw = W / patch[2];
  const int64_t pv = C * patch[0] * patch[1] * patch[2];
  Tensor t({B, gf * gh * gw, pv});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t f = 0; f < gf; ++f)
      for (int64_t y = 0; y < gh; ++y)
        for (int64_t x = 0; x < gw; ++x) {
          float* dst = t.data<float>() + ((b * gf + f) * gh * gw + y * gw + x) * pv;
          int64_t j = 0;
          for (int64_t c = 0; c < C; ++c)
            for (int64_t df = 0; df < patch[0]; ++df)
              for (int64_t dy = 0; dy < patch[1]; ++dy)
                for (int64_t dx = 0; dx < patch[2]; ++dx, ++j)
                  dst[j] = latent.data<
                      float>()[(((b * C + c) * F + f * patch[0] + df) * H + y * patch[1] + dy) * W +
                               x * patch[2] + dx];
        }
  return t;
}

Tensor unpatchify(const Tensor& tokens, int64_t C, std::array<int64_t, 3> grid,
                  std::array<int64_t, 3> patch) {
  const int64_t B = tokens.dim(0), F = grid[0] * patch[0], H = grid[1] * patch[1],
                W = grid[2] * patch[2];
  const int64_t pv = C * patch[0] * patch[1] * patch[2];
  Tensor latent({B, C, F, H, W});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t f = 0; f < grid[0]; ++f)
      for (int64_t y = 0; y < grid[1]; ++y)
        for (int64_t x = 0; x < grid[2]; ++x) {
          const float* src =
              tokens.data<float>() + ((b * grid[0] + f) * grid[1] * grid[2] + y * grid[2] + x) * pv;
          int64_t j = 0;
          for (int64_t c = 0; c < C; ++c)
            for (int64_t df = 0; df < patch[0]; ++df)
              for (int64_t dy = 0; dy < patch[1]; ++dy)
                for (int64_t dx = 0; dx < patch[2]; ++dx, ++j)
                  latent.data<
                      float>()[(((b * C + c) * F + f * patch[0] + df) * H + y * patch[1] + dy) * W +
                               x * patch[2] + dx] = src[j];
        }
  return latent;
}

PatchEmbedding PatchEmbedding::load(const WeightStore& ws, const std::string& name,
                                    std::array<int64_t, 3> patch) {
  return PatchEmbedding{Linear::load(ws, name, true), patch};
}

Tensor PatchEmbedding::forward(const Tensor& latent) const {
  return proj.forward(patchify(latent, patch));
}

}  // namespace seqpar
