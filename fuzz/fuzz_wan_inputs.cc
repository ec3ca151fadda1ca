// Fuzzes the reader of seqpar denoise's --inputs for a Wan model: the first byte picks the model
// the inputs are checked against (bits 0-1: text- or image-to-video, its patch) and the call (bit
// 2: the sampling loop, else one call with a timestep; bit 3: guided), the rest is the safetensors
// file's bytes. With bit 4 set the rest is framed instead: the JSON header, a zero byte, the data;
// the target writes the header's size in front, so that a mutation that grows or shrinks the
// header (a tensor's name, its shape) still gives a file whose header is read (fuzz_safetensors
// fuzzes the size field).
// Either the inputs come back in the shapes the model takes (latents [B, C, F, H, W] on the patch
// grid, text [B, L, text_dim], image [B, L_img, image_dim] for image-to-video, timestep [B] in
// [0, 1000], every value finite), or InvalidArgument says why in one short line naming the file.
// The reader is the command line's own: read_wan_inputs (model_run.h).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "one_line.h"
#include "seqpar/core/error.h"
#include "seqpar/core/tensor.h"
#include "seqpar/model/dit.h"
#include "seqpar/model/model_run.h"
#include "seqpar/model/safetensors.h"
#include "temp_dir.h"

namespace {

using namespace seqpar;

// The models the inputs are checked against: tests/python/test_wan.py's text-to-video checkpoint
// (patch 1x2x2), an image-to-video one, and two other patch grids; widths small, so that inputs
// of a few kilobytes hold whole rows (an image-to-video model's text states are 512 tokens).
DiTConfig wan_model(int which) {
  DiTConfig m;
  m.family = ModelFamily::kDiT;
  m.heads = 4;
  m.head_dim = 20;
  m.in_channels = 4;
  m.text_dim = 16;
  m.patch = {1, 2, 2};
  switch (which) {
    case 1:  // image-to-video: image states of width 4, text states of 512 tokens
      m.in_channels = 8;
      m.text_dim = 2;
      m.image_dim = 4;
      break;
    case 2:
      m.in_channels = 2;
      m.text_dim = 3;
      m.patch = {2, 2, 2};
      break;
    case 3:
      m.in_channels = 1;
      m.text_dim = 1;
      m.patch = {1, 1, 1};
      break;
  }
  m.hidden = m.heads * m.head_dim;
  return m;
}

bool all_finite(const Tensor& t) {
  return std::all_of(t.data<float>(), t.data<float>() + t.numel(),
                     [](float x) { return std::isfinite(x); });
}

// The promise of a read that succeeded: shapes the model takes, finite values.
void check_read(const WanInputs& in, const DiTConfig& m, int steps) {
  const Tensor& x = in.latents;
  if (x.ndim() != 5 || x.dim(0) < 1 || x.dim(1) != m.in_channels) __builtin_trap();
  for (int i = 0; i < 3; ++i)
    if (x.dim(2 + i) < 1 || x.dim(2 + i) % m.patch[i] != 0) __builtin_trap();
  const int64_t B = x.dim(0);
  for (const Tensor* t : {&in.text, &in.negative}) {
    if (t == &in.negative && t->empty()) continue;
    if (t->ndim() != 3 || t->dim(0) != B || t->dim(1) < 1 || t->dim(2) != m.text_dim)
      __builtin_trap();
    if (m.image_dim > 0 && t->dim(1) != 512) __builtin_trap();
  }
  if (m.image_dim > 0) {
    const Tensor& im = in.image;
    if (im.ndim() != 3 || im.dim(0) != B || im.dim(1) < 1 || im.dim(2) != m.image_dim)
      __builtin_trap();
  } else if (!in.image.empty()) {
    __builtin_trap();
  }
  for (const Tensor* t : {&in.latents, &in.text, &in.negative, &in.image})
    if (!all_finite(*t)) __builtin_trap();
  if (steps == 0) {
    if (static_cast<int64_t>(in.timestep.size()) != B) __builtin_trap();
    for (const float t : in.timestep)
      if (!(t >= 0 && t <= 1000)) __builtin_trap();
  } else if (!in.timestep.empty()) {
    __builtin_trap();
  }
}

const std::string& inputs_path() {
  static const fuzz::TempDir dir("seqpar-fuzz-wan-inputs");
  static const std::string path = dir.path() + "/inputs.safetensors";
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const DiTConfig m = wan_model(data[0] & 3);
  const int steps = data[0] & 4 ? 2 : 0;
  const double guidance = data[0] & 8 ? 5.0 : 1.0;
  std::string file(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 16) {  // header \0 data -> u64 little-endian size, header, data
    const size_t end = std::min(file.find('\0'), file.size());
    uint64_t n = end;
    std::string framed(8, '\0');
    for (int i = 0; i < 8; ++i, n >>= 8) framed[i] = static_cast<char>(n & 0xff);
    framed.append(file, 0, end);
    if (end < file.size()) framed.append(file, end + 1);
    file = std::move(framed);
  }
  const std::string& path = inputs_path();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (!file.empty() && std::fwrite(file.data(), 1, file.size(), f) != file.size()) std::abort();
  std::fclose(f);
  try {
    check_read(read_wan_inputs(path, m, steps, guidance), m, steps);
  } catch (const InvalidArgument& e) {
    fuzz::expect_one_short_line(e.what());
    if (std::string_view(e.what()).rfind(path, 0) != 0) __builtin_trap();
  }
  return 0;
}
