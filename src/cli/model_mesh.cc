#include "cli/model_mesh.h"

#include "seqpar/core/error.h"
#include "seqpar/core/limits.h"

namespace seqpar::cli {

void add_mesh_flags(CLI::App* cmd, MeshFlags& f) {
  cmd->add_option("--cfg", f.cfg, "classifier-free guidance parallel size (1 or 2)");
  cmd->add_option("--tp", f.tp, "tensor parallel size");
  cmd->add_option("--ulysses-degree,--ulysses_degree", f.ulysses_degree, "Ulysses degree");
  cmd->add_option("--ring-degree,--ring_degree", f.ring_degree, "ring degree");
  cmd->add_option("--strategy", f.strategy, "ring | allgather (meshes without Ulysses)");
  cmd->add_option("--layout", f.layout, "contiguous | striped | zigzag");
  cmd->add_option("--ulysses-mode,--ulysses_mode", f.ulysses_mode, "strict | uaa");
  cmd->add_flag("--pad", f.pad, "pad the sequence to a multiple of the sequence-parallel size");
}

MeshChoice resolve_mesh(const MeshFlags& f, int64_t heads, const std::string& model, int world) {
  using limits::check_range;
  check_range("--cfg", f.cfg, 1, 2);
  check_range("--tp", f.tp, 1, limits::kMaxRanks);
  check_range("--ring-degree", f.ring_degree, 1, limits::kMaxRanks);
  check_range("--ulysses-degree", f.ulysses_degree, 1, limits::kMaxRanks);
  (void)limits::checked_product({f.cfg, f.tp, f.ring_degree, f.ulysses_degree},
                                "ranks of --cfg x --tp x --ring-degree x --ulysses-degree",
                                limits::kMaxRanks);
  MeshChoice m;
  m.shape = {static_cast<int>(f.cfg), static_cast<int>(f.tp), static_cast<int>(f.ring_degree),
             static_cast<int>(f.ulysses_degree)};
  SEQPAR_ARG_CHECK(world == 0 || m.shape.world() == world, "the mesh ", mesh_shape_text(m.shape),
                   " needs ", m.shape.world(), " ranks but the MPI world has ", world,
                   "; launch mpirun -np ", m.shape.world());
  SEQPAR_ARG_CHECK(heads % f.tp == 0, "--tp ", f.tp, " does not divide the ", heads, " heads of ",
                   model, "; valid: ", divisors_text(heads));
  m.layout = parse_layout(f.layout);
  m.mode = parse_ulysses_mode(f.ulysses_mode);
  m.pad = f.pad;
  if (f.ring_degree > 1 && f.ulysses_degree > 1) {
    m.strategy = Strategy::kUsp;
  } else if (f.ulysses_degree > 1) {
    m.strategy = Strategy::kUlysses;
  } else {
    m.strategy = parse_strategy(f.strategy);
    SEQPAR_ARG_CHECK(m.strategy == Strategy::kRing || m.strategy == Strategy::kAllGather,
                     "--strategy ", f.strategy, " needs --ulysses-degree > 1; with only ",
                     "--ring-degree use ring or allgather");
  }
  return m;
}

ParallelContext rank_context(MeshComms& mc, const MeshChoice& m) {
  ParallelContext ctx;
  ctx.tp = &mc.tp();
  ctx.sp = &mc.sp_comms();
  ctx.cfg = &mc.cfg();
  ctx.strategy = mc.mesh().shape().sp() > 1 ? m.strategy : Strategy::kRing;
  ctx.layout = m.layout;
  ctx.pad = m.pad;
  ctx.cp.ulysses_mode = m.mode;
  return ctx;
}

}  // namespace seqpar::cli
