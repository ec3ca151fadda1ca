// The thread team of a rank: parallel loops of the model's ops and the attention kernel run on it.
//
// Each calling thread (a rank's thread, Python's thread, a test's thread) owns one persistent team
// of omp_get_max_threads() threads: itself and that many minus one workers, started at its first
// parallel loop and kept until the thread ends (or until its thread count changes, when the team
// is rebuilt). A loop of n chunks is handed out one chunk at a time from one atomic counter; the
// caller takes chunks too and returns once every chunk is done, without waiting for a worker that
// took none (a descheduled worker's share goes to the others; no barrier waits for it). Workers
// that find no new loop spin for a while, then sleep on a futex.
//
// parallel_for may be called from any thread. Inside a chunk (on any thread of a team) and inside
// an OpenMP region, parallel_threads() is 1 and parallel_for runs its chunks in order on the
// calling thread, so nested loops never wait on each other; oneDNN, called inside a chunk, runs
// single-threaded (the team's threads keep OpenMP's thread count at 1 while they run chunks).
//
// SEQPAR_TEAM=0 in the environment (read at the first loop) or set_team_enabled(false) makes each
// loop an OpenMP region instead (a fork and a join per loop, as libgomp does it), for comparison.
//
// Ranks that run as threads of one process (the threads backend) share a TeamBoard: each rank's
// thread joins it as its member, and while it waits for another rank (help_on_board(), called by
// the backend's waits) it runs unclaimed chunks of the loops the other members have open. A rank
// the host has descheduled then does not hold up the ranks that wait for it: they take its
// share. Outputs do not depend on which thread runs a chunk, so they are the same bits helped or
// not; a loop is chunked for its team's threads plus the board's other members (loop_threads()).
// SEQPAR_TEAM_HELP=0 (read at the first OnTeamBoard) keeps every thread off its board, for
// comparison.
#pragma once

#include <cstdint>
#include <memory>
#include <type_traits>

namespace seqpar {

// Threads a parallel_for started here would use: 1 inside an OpenMP region, else
// omp_get_max_threads() of the calling thread (1 inside a chunk: the team's threads run chunks
// with OpenMP's thread count at 1).
int parallel_threads();

// Threads that may run the chunks of a parallel_for started here: parallel_threads(), plus the
// other members of the calling thread's TeamBoard where it has joined one (1 inside a chunk). The
// loops' chunk sizes follow it.
int loop_threads();

// Whether parallel loops run on the persistent team (default, unless SEQPAR_TEAM=0) or as OpenMP
// regions. Affects loops started after the call, on every thread.
bool team_enabled();
void set_team_enabled(bool enabled);

// The loops of threads that may run each other's chunks (see above), one slot per member.
class TeamBoard {
 public:
  explicit TeamBoard(int members);
  ~TeamBoard();
  TeamBoard(const TeamBoard&) = delete;
  TeamBoard& operator=(const TeamBoard&) = delete;
  int members() const { return members_; }

  struct Slot;  // core/team.cc
  Slot& slot(int member);

 private:
  int members_;
  std::unique_ptr<Slot[]> slots_;
};

// The calling thread is member `member` of `board` while this lives (one board at a time; the
// board outlives it): its loops are published there for the other members to help with.
class OnTeamBoard {
 public:
  OnTeamBoard(TeamBoard& board, int member);
  ~OnTeamBoard();
  OnTeamBoard(const OnTeamBoard&) = delete;
  OnTeamBoard& operator=(const OnTeamBoard&) = delete;
};

// What help_on_board found.
enum class BoardHelp {
  kIdle,    // no other member has a loop open (or the calling thread has joined no board)
  kBusy,    // another member has a loop open, every chunk of it claimed
  kHelped,  // chunks of another member's loop ran here
};

// Runs unclaimed chunks of the loops other members of the calling thread's board have open.
// Call it only outside chunks and holding no lock a chunk could need; a chunk's exception goes to
// the loop's owner, not here.
BoardHelp help_on_board();

namespace detail {
using ChunkFn = void (*)(void* ctx, int64_t chunk);
void parallel_for(int64_t n, ChunkFn fn, void* ctx);
}  // namespace detail

// Runs body(i) for every i in [0, n), each exactly once, on the calling thread's team (see above);
// returns when all are done. The first exception a chunk throws is rethrown here once every chunk
// is done or skipped (chunks not yet started when it was thrown are skipped).
template <typename Body>
void parallel_for(int64_t n, Body&& body) {
  detail::parallel_for(
      n, [](void* ctx, int64_t i) { (*static_cast<std::remove_reference_t<Body>*>(ctx))(i); },
      const_cast<void*>(static_cast<const void*>(&body)));
}

}  // namespace seqpar
