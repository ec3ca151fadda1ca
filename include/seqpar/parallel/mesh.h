// Process mesh: how the world's ranks split into classifier-free-guidance branches, tensor
// parallelism and sequence (context) parallelism, and the sub-communicators of each axis.
//
// world = cfg x tp x ring x ulysses, outermost first (names as vLLM-Omni and xDiT:
// cfg_parallel_size, tensor_parallel_size, ring_degree, ulysses_degree):
//   rank = ((cfg_rank · tp + tp_rank) · ring + ring_rank) · ulysses + ulysses_rank
//   cp_rank (the sequence-parallel rank) = ring_rank · ulysses + ulysses_rank, in [0, sp)
//   sequence_parallel_size sp = ulysses · ring
// so the ranks of one Ulysses group are consecutive, as SpComms expects of its sp communicator.
// Heads are split contiguously over tp (H divisible by tp); tokens are split contiguously over
// the sp ranks like Partition(S, sp, kContiguous): the first S mod sp ranks hold ceil(S/sp).
// Example: tp 4, ring 8, 40 heads, 1024 tokens: rank 8 is tp_rank 1, cp_rank 0, heads [10, 20),
// tokens [0, 128).
//
// Thread-safety: MeshShape, Mesh and MeshCoord are immutable values. A MeshComms belongs to one
// rank's thread, like the Communicator it was built from.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "seqpar/comm/communicator.h"
#include "seqpar/core/index_range.h"
#include "seqpar/parallel/config.h"
#include "seqpar/parallel/partition.h"
#include "seqpar/parallel/strategies.h"

namespace seqpar {

// Where one rank sits in the mesh.
struct MeshCoord {
  int rank = 0;
  int cfg_rank = 0, tp_rank = 0, ring_rank = 0, ulysses_rank = 0;
  int cp_rank = 0;  // ring_rank · ulysses + ulysses_rank
  bool operator==(const MeshCoord&) const = default;
};

class Mesh {
 public:
  // Throws InvalidArgument if a degree is < 1, if the product exceeds limits::kMaxRanks (checked
  // without overflow), or if world_size > 0 and differs from the product (the message lists
  // degrees that would fit). world_size 0: the product.
  explicit Mesh(MeshShape shape, int world_size = 0);

  const MeshShape& shape() const { return shape_; }
  int world_size() const { return shape_.world(); }
  int sp_size() const { return shape_.sp(); }

  MeshCoord coord(int rank) const;  // rank in [0, world_size)
  int rank_of(int cfg_rank, int tp_rank, int ring_rank, int ulysses_rank) const;

  // Throws InvalidArgument (listing valid choices) unless heads >= 1 divides over tp and
  // seq >= sp (every sp rank holds at least one token).
  void check(int64_t heads, int64_t seq) const;
  // Heads [tp_rank·H/tp, (tp_rank+1)·H/tp) of tensor-parallel rank tp_rank (needs H % tp == 0).
  IndexRange heads(int64_t heads, int tp_rank) const;
  // Tokens of sequence-parallel rank cp_rank under the contiguous partition of seq over sp ranks.
  IndexRange tokens(int64_t seq, int cp_rank) const;
  // The partition of seq tokens over the sp ranks (index = cp_rank) in any layout.
  Partition partition(int64_t seq, Layout layout = Layout::kContiguous) const {
    return Partition(seq, shape_.sp(), layout);
  }

 private:
  MeshShape shape_;
};

// Every rank of `mesh` as the JSON array `seqpar mesh --json` prints (the Python module's
// Mesh.rows() reads the same text): one object per rank, {"rank", "cfg_rank", "tp_rank",
// "ulysses_rank", "ring_rank", "cp_rank", "heads": [first, end), "tokens": [first, end)}.
// Requires mesh.check(heads, seq) to pass.
std::string mesh_rows_json(const Mesh& mesh, int64_t heads, int64_t seq);

// The sub-communicators of one rank. Each group's rank equals the rank's coordinate on its axis:
//   cfg():     the cfg ranks with this rank's tp and cp coordinates      (rank = cfg_rank)
//   tp():      the tp ranks with this rank's cfg and cp coordinates      (rank = tp_rank)
//   sp():      the ulysses x ring ranks with this cfg and tp coordinate  (rank = cp_rank)
//   ring():    the ring ranks of sp() with this ulysses_rank             (rank = ring_rank)
//   ulysses(): the ulysses ranks of sp() with this ring_rank             (rank = ulysses_rank)
// sp_comms() is the SpComms over sp() with ulysses_degree = shape.ulysses, for the strategies;
// its ring() and ulysses() are the groups above.
class MeshComms {
 public:
  // Collective over `world` (every rank calls it with the same shape). Throws InvalidArgument if
  // the shape's product differs from world.size(). `world` must outlive this object.
  MeshComms(Communicator& world, MeshShape shape);

  const Mesh& mesh() const { return mesh_; }
  const MeshCoord& coord() const { return coord_; }
  Communicator& world() { return world_; }
  Communicator& cfg() { return *cfg_; }
  Communicator& tp() { return *tp_; }
  Communicator& sp() { return *sp_; }
  Communicator& ring() { return sp_comms_->ring(); }
  Communicator& ulysses() { return sp_comms_->ulysses(); }
  SpComms& sp_comms() { return *sp_comms_; }

  // Sum of the stats of every group here (not of world), and their reset.
  CommStats stats() const;
  void reset_stats();

 private:
  Communicator& world_;
  Mesh mesh_;
  MeshCoord coord_;
  std::unique_ptr<Communicator> cfg_, tp_, sp_;
  std::unique_ptr<SpComms> sp_comms_;
};

}  // namespace seqpar
