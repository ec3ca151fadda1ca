// What a module needs to run on one rank: its communicators (tensor-parallel group,
// sequence-parallel group, cfg group), the attention strategy, and the model's weights.
// Thread-safety: one ParallelContext per rank thread.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "seqpar/comm/communicator.h"
#include "seqpar/core/tensor.h"
#include "seqpar/model/safetensors.h"
#include "seqpar/parallel/strategies.h"

namespace seqpar {

struct ParallelContext {
  Communicator* tp = nullptr;   // tensor-parallel group: heads and FFN columns split over it
  SpComms* sp = nullptr;        // sequence-parallel group (ulysses x ring)
  Communicator* cfg = nullptr;  // classifier-free-guidance group (size 1 or 2)
  // How the sequence-parallel group runs attention (strategy, layout, ulysses mode, softmax,
  // pad: sequences that do not divide are padded instead of sharded unevenly).
  ParallelConfig config;
  CpOptions cp;  // kernel options (scale, block sizes); the rest is set per call from config

  int tp_rank() const { return tp->rank(); }
  int tp_size() const { return tp->size(); }
  int sp_rank() const { return sp->sp().rank(); }
  int sp_size() const { return sp->sp().size(); }
};

// Classifier-free guidance's two branches over the cfg group: branch(i) computes branch i (0:
// the conditional, 1: the unconditional). On a group of 1 both run here, one after the other; on
// 2, cfg rank i computes branch i and the two are exchanged (one all_gather of fp32 tensors of
// one shape). Every rank returns {branch 0, branch 1}.
std::array<Tensor, 2> cfg_branches(Communicator& cfg, const std::function<Tensor(int)>& branch);

// How a WeightStore's modules hold their matrix weights: as the checkpoint stores them, or int8
// quantized at load as llama.cpp's Q8_0 or per channel (ops.h).
enum class WeightFormat { kCheckpoint, kQ8_0, kInt8Channel };
// The names users give them (`--weights-dtype`, weights_dtype=): "checkpoint", "int8" (Q8_0),
// "int8-channel"; nullopt for any other name.
std::optional<WeightFormat> weight_format_named(std::string_view name);
std::string_view weight_format_name(WeightFormat f);
// The valid names, as one line: "checkpoint, int8, int8-channel" (quote "'": "'checkpoint',
// 'int8', 'int8-channel'").
std::string weight_format_names(std::string_view quote = "");
// The dtypes the linear layers' inputs may be rounded to (WeightStore::set_activations), by the
// names users give them (`--activations`, activations=): "fp32" (as computed) or "bf16";
// nullopt for any other name. activations_names() lists them as weight_format_names() does.
std::optional<DType> activations_named(std::string_view name);
std::string activations_names(std::string_view quote = "");

// A model's parameters by name. A store holds tensors in memory (seeded presets, tensors a loader
// transformed) or refers to tensors of mapped checkpoint files, read only when a module asks and
// only the part it asks for: a tensor-parallel rank reads its rows or columns of each weight,
// nothing else, and keeps them in the checkpoint's dtype (bf16 stays bf16; ops' linear converts
// per block). Every tensor read from a file is checked to be finite.
class WeightStore {
 public:
  struct Spec {
    std::string name;
    std::vector<int64_t> shape;
    float init_std = 0.02f;  // seeded init: normal(0, std); 0 = zeros; < 0 = ones
  };
  // Every parameter from a seeded normal init (each name has its own stream), fp32.
  static WeightStore random(const std::vector<Spec>& specs, uint64_t seed);
  // Every parameter of a safetensors file in seqpar's own layout: the file must hold exactly
  // these names with these shapes (InvalidArgument naming what differs).
  static WeightStore from_safetensors(const std::string& path, const std::vector<Spec>& specs);

  // Tensor `name` is `stored` of `file`, read on request.
  void map(const std::string& name, std::shared_ptr<const SafetensorsFile> file,
           const std::string& stored);
  // Tensor `name` is `t` (replacing what the name referred to).
  void set(const std::string& name, Tensor t);

  bool has(const std::string& name) const;
  std::vector<int64_t> shape(const std::string& name) const;  // Error if missing
  DType dtype(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  // Every tensor, whole, in its stored dtype (to write them to a file).
  std::map<std::string, Tensor> all() const;
  // The whole tensor as fp32 (norm scales, embeddings of presets, small tensors).
  Tensor get(const std::string& name) const;
  // Rows [begin, end) of dimension 0, in the stored dtype.
  Tensor rows(const std::string& name, int64_t begin, int64_t end) const;
  // Columns [begin, end) of the last dimension of a 2-D tensor, in the stored dtype.
  Tensor cols(const std::string& name, int64_t begin, int64_t end) const;
  // Bytes of tensor data this store has read from files (a measure of what a rank holds).
  int64_t bytes_read() const { return bytes_read_; }
  // How the modules built from this store hold their matrix weights (the linear layers, a
  // decoder's embedding and lm_head): as read, or quantized to int8 as they are read (ops.h: Q8_0,
  // `--weights-dtype int8`; per-channel, `--weights-dtype int8-channel`). Copies of the store
  // keep the setting.
  void set_weight_format(WeightFormat f) { weight_format_ = f; }
  WeightFormat weight_format() const { return weight_format_; }
  // The same as a switch between kCheckpoint (false) and kQ8_0 (true); int8_matrices() is true
  // for either int8 format.
  void set_int8_matrices(bool on) {
    weight_format_ = on ? WeightFormat::kQ8_0 : WeightFormat::kCheckpoint;
  }
  bool int8_matrices() const { return weight_format_ != WeightFormat::kCheckpoint; }
  // max |w| over each row of the 2-D tensor `name`, fp32 (rows): the per-channel scale's
  // measure of a whole row, for a rank that holds some of its columns. Reads the whole tensor a
  // block of rows at a time; not counted in bytes_read() (nothing of it is held). Non-finite
  // values are refused as rows() refuses them.
  Tensor row_abs_max(const std::string& name) const;
  // The dtype those modules round their inputs to before the product (ops.h linear()): fp32
  // (none), or bf16 (`--activations bf16`: oneDNN's bf16 matmul on a bf16 weight where the CPU
  // has AVX512-BF16 or AMX). Copies of the store keep the setting.
  void set_activations(DType d) { activations_ = d; }
  DType activations() const { return activations_; }

 private:
  struct FileTensor {
    std::shared_ptr<const SafetensorsFile> file;
    std::string stored;
  };
  const FileTensor* file_tensor(const std::string& name) const;
  const Tensor& memory_tensor(const std::string& name) const;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, FileTensor> files_;
  mutable int64_t bytes_read_ = 0;
  WeightFormat weight_format_ = WeightFormat::kCheckpoint;
  DType activations_ = DType::kF32;
};

}  // namespace seqpar
