// Schedules: what one attention call does on every rank of the sequence-parallel group, as data.
// A rank's schedule is its steps in order; a step is a collective or a ring transfer (or
// nothing), the attention computed in it, and the bytes it copies locally. The bytes are those
// CommStats counts, the work is CpStats::work, the peak K/V is CpStats::peak_kv_bytes: tests
// check all three against real runs, and the planner replays schedules on a hardware profile
// (plan/cost_model.h). Each strategy's schedule is written next to its run function
// (allgather.cc, ring.cc, ulysses.cc, decode.cc, joint.cc, const_max.cc).
//
// Replaying (docs/planner.md): a step with a collective starts when every member has reached it;
// a ring transfer (overlaps_compute) meets the ring neighbours in the same step, the transfer
// running while the step's work is computed.
// Thread-safety: values; the functions are pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "seqpar/comm/communicator.h"
#include "seqpar/parallel/config.h"
#include "seqpar/parallel/strategies.h"

namespace seqpar {

// The communicator a step runs on (SpComms): the whole group, a Ulysses group, a ring group.
enum class CommGroup { kSp, kUlysses, kRing };
std::string_view comm_group_name(CommGroup g);  // "sp", "ulysses", "ring"

// What this rank exchanges with one peer (an sp rank) in a step.
struct PeerBytes {
  int peer = 0;
  uint64_t sent = 0, recv = 0;
};

// The members of a group as sp ranks in group order: first, first + stride, ... (count of
// them). SpComms' groups are all of this form: the sp group (0, 1, N), a Ulysses group (g·U, 1,
// U), a ring group (j, U, R). A ring's neighbours are the members left and right.
struct GroupMembers {
  int first = 0, stride = 1, count = 1;
  int operator[](int i) const { return first + i * stride; }
  int size() const { return count; }
  bool operator==(const GroupMembers&) const = default;
};

// One collective, or one step's transfer of a ring.
struct Transfer {
  OpKind op = OpKind::kSendRecv;
  bool varying = false;  // counts differ per member: all_gatherv, all_to_allv
  std::string what;      // "k", "v", "q", "k, v", "out, lse", "token counts", "key norms", ...
  CommGroup group = CommGroup::kSp;
  GroupMembers members;
  uint64_t sent = 0, recv = 0;    // bytes of this rank, as CommStats counts them
  std::vector<PeerBytes> peers;   // all_to_all: per peer (the rest: empty)
  int64_t calls = 1;              // ops (a ring step: K and V)
  bool overlaps_compute = false;  // a ring transfer: runs during the step's attention
  std::string op_name() const;    // "send_recv", "all_gatherv", "all_to_allv", "all_reduce", ...
};

struct Step {
  std::optional<Transfer> comm;  // none: compute only
  int64_t work = 0;              // visible score elements computed (B·heads·pairs)
  // The same work on every rank, counted by CpStats::work on rank 0 only (joint attention's
  // text over text).
  bool replicated = false;
  double copy_bytes = 0;  // local copies and merges: bytes read plus written
};

struct RankSchedule {
  int64_t tokens = 0;         // its queries (sharded tokens, padding included; new tokens)
  int64_t kv_tokens = 0;      // its own K/V (over a cache: its cached and new tokens)
  int64_t peak_kv_bytes = 0;  // CpStats::peak_kv_bytes
  std::vector<Step> steps;
};

struct Schedule {
  std::vector<RankSchedule> ranks;  // per sequence-parallel rank
  int sp() const { return static_cast<int>(ranks.size()); }
};

// Sums over a rank's steps: bytes (CommStats totals) and work (CpStats::work).
CommPrediction schedule_bytes(const Schedule& s, int rank);
int64_t schedule_work(const Schedule& s, int rank);

// The schedule of config c (its sequence-parallel part: degrees, strategy, layout, softmax,
// padding) on shape s, heads as the group sees them (after tp): validate_config's checks, then
// dispatches on c.strategy; text_tokens > 0 appends joint attention's text part. The rings'
// transfers and peak K/V follow s.kv_use (kLend: one more block each way, the own one home).
Schedule attention_schedule(const ParallelConfig& c, const AttnShape& s);

// Each strategy's schedule (c.strategy is not consulted). Over a sharded sequence:
Schedule local_schedule(const ParallelConfig& c, const AttnShape& s);
Schedule allgather_schedule(const ParallelConfig& c, const AttnShape& s);
Schedule ring_schedule(const ParallelConfig& c, const AttnShape& s);   // const-max: key norms
Schedule steal_schedule(const ParallelConfig& c, const AttnShape& s);  // ring, schedule steal
Schedule ulysses_schedule(const ParallelConfig& c, const AttnShape& s);
Schedule usp_schedule(const ParallelConfig& c, const AttnShape& s);
// Over a K/V cache (s.cached, s.fresh; decode_placement):
Schedule passkv_schedule(const ParallelConfig& c, const AttnShape& s);
Schedule passq_schedule(const ParallelConfig& c, const AttnShape& s);
Schedule passq_ring_schedule(const ParallelConfig& c, const AttnShape& s);  // schedule ring
// Joint attention's text part (s.text_tokens), appended to the image part's schedule.
void add_joint_text_schedule(Schedule& image, const ParallelConfig& c, const AttnShape& s);

}  // namespace seqpar
