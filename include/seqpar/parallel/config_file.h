// The parallel layout as other engines write it: vLLM-Omni's and xDiT's names for the degrees
// (tensor_parallel_size, cfg_parallel_size, ulysses_degree, ring_degree,
// sequence_parallel_size, ulysses_mode), given as command-line flags or read from a JSON or YAML
// file (`--parallel-config FILE`), and resolved into ParallelConfig's degrees.
//
// A file holds either those keys at its top level, or a `parallel_config` mapping anywhere in it
// (as a vLLM-Omni stage config nests it under stage_args / engine_args); the first one found is
// read. YAML is read as far as such files use it: block mappings and lists of mappings by
// indentation, `key: value` scalars (integers, bare or quoted strings), comments. Unknown keys
// inside the mapping are refused (naming the valid ones); pipeline_parallel_size and
// data_parallel_size are accepted only as 1.
// Thread-safety: pure functions of their arguments (read_parallel_config_file reads the file).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "seqpar/parallel/config.h"

namespace seqpar {

// What a file or the flags gave; unset: not given.
struct DegreeSpec {
  std::optional<int64_t> cfg, tp, ring, ulysses, sp;  // sp: sequence_parallel_size
  std::optional<std::string> ulysses_mode;
  // Values of `over` replace those given here.
  DegreeSpec merged_with(const DegreeSpec& over) const;
};

// Parses the text of a parallel-config file (JSON if it starts with '{', else YAML); `source`
// names it in messages. InvalidArgument (one line) on malformed text, unknown keys, or values that
// are not positive integers (or a known ulysses_mode).
DegreeSpec parse_parallel_config(std::string_view text, std::string_view source);
// The file at `path` (a regular file of at most limits::kMaxFileBytes), parsed.
DegreeSpec read_parallel_config_file(const std::string& path);

// The mesh degrees of a spec: unset cfg and tp are 1; sequence_parallel_size is ulysses x ring:
// with neither degree given the ring takes it (ring_degree = sp, ulysses_degree 1), with one the
// other is sp / it; given with both it must equal their product. InvalidArgument otherwise.
MeshShape resolve_degrees(const DegreeSpec& d);

}  // namespace seqpar
