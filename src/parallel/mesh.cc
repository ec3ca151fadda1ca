#include "seqpar/parallel/mesh.h"

#include <string>

#include "seqpar/core/error.h"
#include "seqpar/core/limits.h"
#include "seqpar/core/param_error.h"

namespace seqpar {

namespace {

std::string flags_text(const MeshShape& s) {
  return detail::concat(param("cfg"), " ", s.cfg, " x ", param("tp"), " ", s.tp, " x ",
                        param("ring_degree"), " ", s.ring, " x ", param("ulysses_degree"), " ",
                        s.ulysses);
}

// What would fit a world of n ranks, given the degrees the user chose (param() names: for a
// ParamError's message).
std::string world_hint(const MeshShape& s, int n) {
  const int outer = s.cfg * s.tp;
  if (n % outer == 0) {
    const int sp = n / outer;
    // sp <= 2^16 has at most 122 divisors; the pairs are listed like divisors_text's, ends only.
    const std::vector<int64_t> d = limits::divisors(sp);
    std::string pairs;
    for (size_t i = 0; i < d.size(); ++i) {
      if (d.size() > 16 && i == 8) {
        pairs += detail::concat(", ... (", d.size() - 16, " more)");
        i = d.size() - 8;
      }
      pairs += detail::concat(pairs.empty() ? "" : ", ", d[i], " x ", sp / d[i]);
    }
    return detail::concat("with ", param("cfg"), " ", s.cfg, " ", param("tp"), " ", s.tp, ", ",
                          param("ulysses_degree"), " x ", param("ring_degree"), " must be ", sp,
                          " (", pairs, ")");
  }
  return detail::concat("every degree must divide ", n, ": ", divisors_text(n),
                        ", and their product equal ", n);
}

}  // namespace

Mesh::Mesh(MeshShape shape, int world_size) : shape_(shape) {
  const std::pair<const char*, int> degrees[] = {{"cfg", shape.cfg},
                                                 {"tp", shape.tp},
                                                 {"ring_degree", shape.ring},
                                                 {"ulysses_degree", shape.ulysses}};
  for (const auto& [name, d] : degrees)
    SEQPAR_PARAM_CHECK(d >= 1, name, "at least 1", param(name), " ", d,
                       " is invalid; every degree (", param("cfg"), ", ", param("tp"), ", ",
                       param("ring_degree"), ", ", param("ulysses_degree"), ") must be at least 1");
  (void)limits::checked_product(
      {shape.cfg, shape.tp, shape.ring, shape.ulysses},
      detail::concat("the world size ", param("cfg"), " ", shape.cfg, " x ", param("tp"), " ",
                     shape.tp, " x ", param("ring_degree"), " ", shape.ring, " x ",
                     param("ulysses_degree"), " ", shape.ulysses),
      limits::kMaxRanks);
  SEQPAR_PARAM_CHECK(world_size >= 0 && world_size <= limits::kMaxRanks, "ranks",
                     detail::concat("1 to ", limits::max_text(limits::kMaxRanks)), param("ranks"),
                     " ", world_size, " is invalid; valid: 1 to ",
                     limits::max_text(limits::kMaxRanks));
  SEQPAR_PARAM_CHECK(world_size == 0 || world_size == shape.world(), "ranks",
                     detail::concat(shape.world()), flags_text(shape), " = ", shape.world(),
                     " ranks, but the world size (", param("ranks"), ") is ", world_size, "; ",
                     world_hint(shape, world_size));
}

MeshCoord Mesh::coord(int rank) const {
  SEQPAR_CHECK(rank >= 0 && rank < world_size(), "rank ", rank, " outside the mesh of ",
               world_size());
  MeshCoord c;
  c.rank = rank;
  c.ulysses_rank = rank % shape_.ulysses;
  rank /= shape_.ulysses;
  c.ring_rank = rank % shape_.ring;
  rank /= shape_.ring;
  c.tp_rank = rank % shape_.tp;
  c.cfg_rank = rank / shape_.tp;
  c.cp_rank = c.ring_rank * shape_.ulysses + c.ulysses_rank;
  return c;
}

int Mesh::rank_of(int cfg_rank, int tp_rank, int ring_rank, int ulysses_rank) const {
  SEQPAR_CHECK(cfg_rank >= 0 && cfg_rank < shape_.cfg && tp_rank >= 0 && tp_rank < shape_.tp &&
                   ring_rank >= 0 && ring_rank < shape_.ring && ulysses_rank >= 0 &&
                   ulysses_rank < shape_.ulysses,
               "coordinates outside the mesh ", mesh_shape_text(shape_));
  return ((cfg_rank * shape_.tp + tp_rank) * shape_.ring + ring_rank) * shape_.ulysses +
         ulysses_rank;
}

void Mesh::check(int64_t heads, int64_t seq) const {
  SEQPAR_PARAM_CHECK(heads >= 1, "heads", "at least 1", param("heads"), " ", heads,
                     " is invalid; it must be at least 1");
  SEQPAR_PARAM_CHECK(heads % shape_.tp == 0, "tp", divisors_text(heads), param("heads"), " ", heads,
                     " is not divisible by ", param("tp"), " ", shape_.tp, "; valid ", param("tp"),
                     " for ", heads, " heads: ", divisors_text(heads));
  SEQPAR_PARAM_CHECK(seq >= 1, "seq", "at least 1", param("seq"), " ", seq,
                     " is invalid; it must be at least 1");
  SEQPAR_PARAM_CHECK(seq >= shape_.sp(), "seq", detail::concat("at least ", shape_.sp()),
                     param("seq"), " ", seq, " is shorter than the sequence-parallel size ",
                     shape_.sp(), " (", param("ulysses_degree"), " ", shape_.ulysses, " x ",
                     param("ring_degree"), " ", shape_.ring,
                     "): every sp rank needs a token; valid: ", param("seq"), " >= ", shape_.sp(),
                     ", or ", param("ulysses_degree"), " x ", param("ring_degree"), " <= ", seq);
}

IndexRange Mesh::heads(int64_t heads, int tp_rank) const {
  SEQPAR_PARAM_CHECK(heads >= 1 && heads % shape_.tp == 0, "tp", divisors_text(heads),
                     param("heads"), " ", heads, " is not divisible by ", param("tp"), " ",
                     shape_.tp, "; valid ", param("tp"), " for ", heads,
                     " heads: ", divisors_text(heads));
  SEQPAR_CHECK(tp_rank >= 0 && tp_rank < shape_.tp, "tp_rank ", tp_rank, " of ", shape_.tp);
  const int64_t per = heads / shape_.tp;
  return {tp_rank * per, (tp_rank + 1) * per};
}

IndexRange Mesh::tokens(int64_t seq, int cp_rank) const {
  const int n = shape_.sp();
  SEQPAR_PARAM_CHECK(seq >= n, "seq", detail::concat("at least ", n), param("seq"), " ", seq,
                     " is shorter than the sequence-parallel size ", n);
  SEQPAR_CHECK(cp_rank >= 0 && cp_rank < n, "cp_rank ", cp_rank, " of ", n);
  // As Partition(seq, n, kContiguous): the first seq mod n ranks hold one token more.
  const int64_t base = seq / n, extra = seq % n;
  const int64_t begin = cp_rank * base + std::min<int64_t>(cp_rank, extra);
  return {begin, begin + base + (cp_rank < extra ? 1 : 0)};
}

MeshComms::MeshComms(Communicator& world, MeshShape shape)
    : world_(world), mesh_(shape, world.size()), coord_(mesh_.coord(world.rank())) {
  const MeshShape& s = mesh_.shape();
  const MeshCoord& c = coord_;
  // One split per axis: the color numbers the other coordinates, the key orders by this one.
  // Every rank calls the splits in the same order (they are collectives over world).
  cfg_ = world.split(c.tp_rank * s.sp() + c.cp_rank, c.cfg_rank);
  tp_ = world.split(c.cfg_rank * s.sp() + c.cp_rank, c.tp_rank);
  sp_ = world.split(c.cfg_rank * s.tp + c.tp_rank, c.cp_rank);
  // Within sp (rank = cp_rank), SpComms groups ulysses_degree consecutive ranks (one ring_rank)
  // and strides them for the ring groups (one ulysses_rank), matching the coordinates above.
  sp_comms_ = std::make_unique<SpComms>(*sp_, s.ulysses);
  SEQPAR_CHECK(cfg_->rank() == c.cfg_rank && tp_->rank() == c.tp_rank && sp_->rank() == c.cp_rank &&
                   ring().rank() == c.ring_rank && ulysses().rank() == c.ulysses_rank,
               "sub-communicator ranks do not match the mesh coordinates");
}

CommStats MeshComms::stats() const {
  CommStats total = cfg_->stats();
  total += tp_->stats();
  total += sp_comms_->stats();  // sp, ring, ulysses
  return total;
}

void MeshComms::reset_stats() {
  cfg_->stats().reset();
  tp_->stats().reset();
  sp_comms_->reset_stats();
}

std::string mesh_rows_json(const Mesh& mesh, int64_t heads, int64_t seq) {
  std::string out = "[";
  for (int r = 0; r < mesh.world_size(); ++r) {
    const MeshCoord c = mesh.coord(r);
    const IndexRange h = mesh.heads(heads, c.tp_rank);
    const IndexRange t = mesh.tokens(seq, c.cp_rank);
    out += detail::concat(r ? "," : "", "{\"rank\":", c.rank, ",\"cfg_rank\":", c.cfg_rank,
                          ",\"tp_rank\":", c.tp_rank, ",\"ulysses_rank\":", c.ulysses_rank,
                          ",\"ring_rank\":", c.ring_rank, ",\"cp_rank\":", c.cp_rank,
                          ",\"heads\":[", h.begin, ",", h.end, "],\"tokens\":[", t.begin, ",",
                          t.end, "]}");
  }
  return out + "]";
}

}  // namespace seqpar
