// mpi backend. Every op is a non-blocking MPI call polled with MPI_Test until it completes or
// its deadline passes. Each world (one mpi_world() call) also owns a private duplicate of
// MPI_COMM_WORLD, the error communicator, shared by every communicator split from it: abort()
// sends its message there to every rank, and every poll loop probes it, so one rank's failure
// becomes a CommError everywhere instead of a hang.
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <type_traits>

#include "mpi/mpi_internal.h"
#include "op_rules.h"
#include "seqpar/comm/mpi.h"
#include "trace_op.h"

namespace seqpar {

namespace rules = comm_rules;
using Clock = std::chrono::steady_clock;
using detail::concat;

namespace {

constexpr int kAbortTag = 1;
// A rank whose collective timed out asks every member "are you waiting in communication?"; a
// rank polling any operation answers. Members that do not answer are named in the timeout.
constexpr int kPresenceTag = 2;
constexpr int kPresenceReplyTag = 3;
constexpr size_t kMaxAbortText = 2000;  // bytes; keeps the abort message in the eager protocol
constexpr size_t kChunkBytes = size_t{1} << 30;

constexpr size_t kDefaultStageBytes = size_t{64} << 10;

std::thread::id g_mpi_thread;
size_t g_max_count = INT_MAX;
size_t g_stage_bytes = kDefaultStageBytes;

// Texts of abort messages in flight (their sends are freed, never waited for) and the argument
// arrays of collectives abandoned after a failure: MPI may still read them, so they live until
// the process exits.
std::mutex g_keep_alive_mu;
std::deque<std::string> g_abort_texts;
std::deque<std::shared_ptr<void>> g_abandoned;

bool mpi_finalized() {
  int f = 0;
  MPI_Finalized(&f);
  return f != 0;
}

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return concat("MPI error ", code);
  return std::string(text, static_cast<size_t>(len));
}

// A failed MPI call; `code` lets callers turn MPI_ERR_TRUNCATE into a clearer message.
class MpiCallError : public CommError {
 public:
  MpiCallError(int code, const std::string& what)
      : CommError(concat(what, " failed: ", mpi_error_string(code))), code(code) {}
  int code;
};

void check_mpi(int rc, const std::string& what) {
  if (rc != MPI_SUCCESS) throw MpiCallError(rc, what);
}

void require_mpi_thread() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  SEQPAR_CHECK(initialized && !mpi_finalized(), "MPI is not initialized: call mpi_init() first");
  SEQPAR_CHECK(std::this_thread::get_id() == g_mpi_thread,
               "MPI communicators may only be used from the thread that called mpi_init() "
               "(MPI_THREAD_FUNNELED)");
}

int to_int(size_t v) { return static_cast<int>(v); }

// `n` contiguous bytes at byte offset `offset` as an MPI (type, count) pair with count <= the
// max count: MPI_BYTE when that fits, else a committed struct of 1 GiB chunks plus a remainder.
// With offset 0 the type's extent is n (usable with counts and per-rank strides); with another
// offset it describes one block to send or receive with count 1.
class ByteType {
 public:
  explicit ByteType(size_t n, MPI_Aint offset = 0) {
    if (offset == 0 && n <= g_max_count) {
      count_ = to_int(n);
      return;
    }
    const size_t chunk = std::min(g_max_count, kChunkBytes);
    const size_t q = n / chunk, r = n % chunk;
    SEQPAR_CHECK(q <= size_t{INT_MAX}, "message of ", n, " bytes is too large");
    MPI_Datatype chunk_type = MPI_DATATYPE_NULL;
    int lens[2];
    MPI_Aint disps[2];
    MPI_Datatype types[2];
    int blocks = 0;
    if (q > 0) {
      MPI_Type_contiguous(to_int(chunk), MPI_BYTE, &chunk_type);
      lens[blocks] = to_int(q);
      disps[blocks] = offset;
      types[blocks++] = chunk_type;
    }
    if (r > 0 || blocks == 0) {
      lens[blocks] = to_int(r);
      disps[blocks] = offset + static_cast<MPI_Aint>(q * chunk);
      types[blocks++] = MPI_BYTE;
    }
    MPI_Datatype raw;
    MPI_Type_create_struct(blocks, lens, disps, types, &raw);
    if (offset == 0) {
      MPI_Type_create_resized(raw, 0, static_cast<MPI_Aint>(n), &type_);
      MPI_Type_free(&raw);
    } else {
      type_ = raw;
    }
    if (chunk_type != MPI_DATATYPE_NULL) MPI_Type_free(&chunk_type);
    MPI_Type_commit(&type_);
    owned_ = true;
    count_ = 1;
  }
  ~ByteType() {
    if (owned_ && !mpi_finalized()) MPI_Type_free(&type_);
  }
  ByteType(const ByteType&) = delete;
  ByteType& operator=(const ByteType&) = delete;

  MPI_Datatype type() const { return type_; }
  int count() const { return count_; }

 private:
  MPI_Datatype type_ = MPI_BYTE;
  int count_ = 0;
  bool owned_ = false;
};

// libnbc reads sendbuf == recvbuf as MPI_IN_PLACE. all_to_all(v) forbid aliasing unless one side
// is empty; the empty side's pointer is never dereferenced, so it may point anywhere else.
char g_empty_buffer[1];
void distinct_buffers(const void*& in, size_t in_bytes, void*& out) {
  if (in != out) return;
  if (in_bytes == 0) {
    in = g_empty_buffer;
  } else {
    out = g_empty_buffer;
  }
}

// Arguments a non-blocking collective reads until it completes, and its staging copy of small
// buffers. Kept alive for good if the collective is abandoned after a failure.
struct CollArgs {
  std::vector<int> ints;
  std::vector<MPI_Datatype> types;
  std::vector<std::unique_ptr<ByteType>> owned;
  std::vector<char> stage;

  char* make_stage(size_t bytes) {
    stage.resize(std::max<size_t>(bytes, 1));
    return stage.data();
  }
};

// One mpi_world() and everything split from it: the error communicator and this rank's
// knowledge of a failure.
class MpiWorld {
 public:
  explicit MpiWorld(MPI_Comm err_comm) : err_comm_(err_comm) {
    MPI_Comm_rank(err_comm_, &rank_);
    MPI_Comm_size(err_comm_, &size_);
  }
  ~MpiWorld() {
    // A failed world is leaked on purpose, with every communicator split from it: abandoned
    // collectives and late failure messages may still arrive for it, and freeing would let MPI
    // reuse its context id for a new communicator that could then match them.
    if (failed_ || mpi_finalized()) return;
    MPI_Comm_free(&err_comm_);
  }

  int rank() const { return rank_; }
  bool failed() const { return failed_; }

  // Throws CommError if this rank failed or learned of another rank's failure. Answers presence
  // queries first (this rank is waiting in communication).
  void check() {
    answer_presence();
    if (!failed_) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kAbortTag, err_comm_, &flag, &st);
      if (flag) {
        std::string text = receive(st);
        failed_ = true;
        failure_ = rules::peer_failed_message(st.MPI_SOURCE, text);
        peer_failed_ = true;
      }
    }
    if (failed_) {
      if (peer_failed_) throw PeerFailed(failure_);
      throw CommError(failure_);
    }
  }

  MPI_Comm err_comm() const { return err_comm_; }

  // Answers every pending presence query: this rank is polling an operation.
  void answer_presence() noexcept {
    static const char kYes = 1;
    for (;;) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kPresenceTag, err_comm_, &flag, &st) != MPI_SUCCESS || !flag)
        return;
      char q = 0;
      MPI_Recv(&q, 1, MPI_CHAR, st.MPI_SOURCE, kPresenceTag, err_comm_, MPI_STATUS_IGNORE);
      MPI_Request req;
      if (MPI_Isend(&kYes, 1, MPI_CHAR, st.MPI_SOURCE, kPresenceReplyTag, err_comm_, &req) ==
          MPI_SUCCESS)
        MPI_Request_free(&req);
    }
  }

  // The world ranks among `members` that do not answer a presence query within `grace`: not
  // polling any operation (computing, stopped or hung outside communication). Best effort.
  std::vector<int> absent(const std::vector<int>& members, std::chrono::milliseconds grace) {
    static const char kQuery = 0;
    std::vector<char> answered(static_cast<size_t>(size_), 0);
    int pending = 0;
    for (int r : members) {
      if (r == rank_) continue;
      MPI_Request req;
      if (MPI_Isend(&kQuery, 1, MPI_CHAR, r, kPresenceTag, err_comm_, &req) == MPI_SUCCESS) {
        MPI_Request_free(&req);
        ++pending;
      } else {
        answered[r] = 1;  // cannot ask: name no one rather than the wrong one
      }
    }
    const auto end = Clock::now() + grace;
    while (pending > 0 && Clock::now() < end) {
      answer_presence();  // another rank timing out at once asks this one
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kPresenceReplyTag, err_comm_, &flag, &st);
      if (!flag) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        continue;
      }
      char a = 0;
      MPI_Recv(&a, 1, MPI_CHAR, st.MPI_SOURCE, kPresenceReplyTag, err_comm_, MPI_STATUS_IGNORE);
      if (!answered[st.MPI_SOURCE]) {
        answered[st.MPI_SOURCE] = 1;
        --pending;
      }
    }
    std::vector<int> out;
    for (int r : members)
      if (r != rank_ && !answered[r]) out.push_back(r);
    return out;
  }

  // The first abort message of another rank within `grace` (after this rank's own failure,
  // which stops check() from looking): {its rank, its text}, or {-1, ""}.
  std::pair<int, std::string> peer_abort(std::chrono::milliseconds grace) {
    const auto end = Clock::now() + grace;
    try {
      if (std::this_thread::get_id() != g_mpi_thread || mpi_finalized()) return {-1, ""};
      while (Clock::now() < end) {
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, kAbortTag, err_comm_, &flag, &st);
        if (flag) return {st.MPI_SOURCE, receive(st)};
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    } catch (...) {
    }
    return {-1, ""};
  }

  // Announces this rank's failure to every rank. Best effort; never throws.
  void abort(const std::string& message) noexcept {
    if (failed_) return;  // already failed, or a peer's failure is known: nothing new to tell
    failed_ = true;
    failure_ = rules::peer_failed_message(rank_, message);
    try {
      if (std::this_thread::get_id() != g_mpi_thread || mpi_finalized()) return;
      const std::string* text;
      {
        std::lock_guard<std::mutex> lk(g_keep_alive_mu);
        g_abort_texts.push_back(message.substr(0, kMaxAbortText));
        text = &g_abort_texts.back();
      }
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        MPI_Request req;
        if (MPI_Isend(text->data(), to_int(text->size()), MPI_CHAR, r, kAbortTag, err_comm_,
                      &req) == MPI_SUCCESS) {
          MPI_Request_free(&req);
        }
      }
    } catch (...) {
    }
  }

 private:
  std::string receive(const MPI_Status& st) {
    int n = 0;
    MPI_Get_count(&st, MPI_CHAR, &n);
    std::string text(static_cast<size_t>(n), '\0');
    MPI_Recv(text.data(), n, MPI_CHAR, st.MPI_SOURCE, kAbortTag, err_comm_, MPI_STATUS_IGNORE);
    return text;
  }

  MPI_Comm err_comm_;
  int rank_ = 0, size_ = 1;
  bool failed_ = false;
  std::string failure_;
  bool peer_failed_ = false;  // failure_ is another rank's
};

// The MPI communicator of one Communicator, kept alive by its pending requests.
struct MpiCore {
  MPI_Comm comm = MPI_COMM_NULL;
  std::shared_ptr<MpiWorld> world;
  rules::StatsLink link;
  int rank = 0, size = 1;
  bool is_world = false;

  ~MpiCore() {
    if (comm != MPI_COMM_NULL && !world->failed() && !mpi_finalized()) MPI_Comm_free(&comm);
  }

  std::string who() const { return rules::rank_label(rank, world->rank(), is_world); }

  // World ranks of this communicator's members, by rank.
  std::vector<int> world_ranks() const {
    MPI_Group mine, all;
    MPI_Comm_group(comm, &mine);
    MPI_Comm_group(world->err_comm(), &all);
    std::vector<int> in(static_cast<size_t>(size)), out(static_cast<size_t>(size));
    for (int i = 0; i < size; ++i) in[i] = i;
    MPI_Group_translate_ranks(mine, size, in.data(), all, out.data());
    MPI_Group_free(&mine);
    MPI_Group_free(&all);
    return out;
  }

  // For a collective that timed out: ", which world rank(s) R did not reach (...)" naming the
  // members that do not answer a presence query, or "" if every member is waiting somewhere.
  std::string missing_text(std::chrono::milliseconds timeout) {
    const auto grace =
        std::clamp(timeout / 4, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
    const std::vector<int> missing = world->absent(world_ranks(), grace);
    if (missing.empty()) return "";
    std::string ranks;
    for (int r : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    return concat(", which world rank", missing.size() > 1 ? "s " : " ", ranks,
                  " did not reach (no answer within ", grace.count(),
                  " ms: busy, stopped or hung outside communication)");
  }

  // Polls `req` until it completes. Throws CommError when a failure of any rank of the world is
  // known, or when the deadline passes (after announcing the timeout to every rank; for a
  // collective the message names the members that never arrived, when they can be told).
  void progress(MPI_Request* req, MPI_Status* status, const std::string& what,
                Clock::time_point deadline, std::chrono::milliseconds timeout,
                bool collective = false) {
    const auto start = Clock::now();
    for (uint64_t i = 0;; ++i) {
      int done = 0;
      check_mpi(MPI_Test(req, &done, status), what);
      if (done) return;
      try {
        world->check();
      } catch (const CommError&) {
        // An op that completed meanwhile did not fail (the failure shows at the next call).
        check_mpi(MPI_Test(req, &done, status), what);
        if (done) return;
        throw;
      }
      const auto now = Clock::now();
      if (now >= deadline) {
        const std::string missing = collective ? missing_text(timeout) : std::string();
        std::string msg = rules::timeout_message(timeout, who(), what + missing);
        world->abort(msg);
        throw CommTimeout(msg);
      }
      // Spin briefly (low latency), then yield (MPI progresses only inside MPI calls, so long
      // transfers need frequent polls), then sleep a little on long waits.
      if (i < 256) continue;
      if (now - start < std::chrono::seconds(2)) {
        sched_yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }
};

class MpiRequest final : public RequestImpl {
 public:
  MpiRequest(std::shared_ptr<MpiCore> core, bool is_recv, size_t bytes, int peer, int tag,
             std::chrono::milliseconds timeout, std::unique_ptr<ByteType> type)
      : core_(std::move(core)),
        is_recv_(is_recv),
        bytes_(bytes),
        peer_(peer),
        tag_(tag),
        timeout_(timeout),
        type_(std::move(type)) {}

  ~MpiRequest() override { cancel(); }

  MPI_Request* handle() { return &req_; }

  void wait() override {
    if (done_) return;
    if (!error_.empty()) throw CommError(error_);
    require_mpi_thread();
    trace::Scope span(!trace::enabled() ? std::string()
                      : is_recv_        ? detail::concat("wait recv from ", peer_)
                                        : detail::concat("wait send to ", peer_),
                      "comm", trace::Lane::kComm);
    span.arg("bytes", static_cast<int64_t>(bytes_));
    rules::WaitClock clock(core_->link.stats);
    MPI_Status st;
    try {
      core_->progress(&req_, &st, describe(), Clock::now() + timeout_, timeout_);
    } catch (const MpiCallError& e) {
      fail_call(e);
    } catch (const CommError& e) {
      fail(e.what());
    }
    finish(st);
  }

  bool test() override {
    if (done_) return true;
    if (!error_.empty()) throw CommError(error_);
    require_mpi_thread();
    int done = 0;
    MPI_Status st;
    try {
      check_mpi(MPI_Test(&req_, &done, &st), describe());
      if (!done) core_->world->check();
    } catch (const MpiCallError& e) {
      fail_call(e);
    } catch (const CommError& e) {
      fail(e.what());
    }
    if (done) finish(st);
    return done != 0;
  }

 private:
  std::string describe() const {
    return is_recv_ ? concat("recv from rank ", peer_, " (tag ", tag_, ")")
                    : concat("send to rank ", peer_, " (tag ", tag_, ")");
  }

  [[noreturn]] void fail_call(const MpiCallError& e) {
    int error_class = 0;
    MPI_Error_class(e.code, &error_class);
    if (is_recv_ && error_class == MPI_ERR_TRUNCATE) {
      fail(concat("message size mismatch: ", core_->who(), " receives ", bytes_,
                  " bytes from rank ", peer_, " (tag ", tag_, ") but the message is longer"));
    }
    fail(e.what());
  }

  [[noreturn]] void fail(const std::string& msg) {
    cancel();
    error_ = msg;
    throw CommError(error_);
  }

  // The op completed: checks that a receive got exactly the bytes it expected.
  void finish(const MPI_Status& st) {
    req_ = MPI_REQUEST_NULL;
    if (is_recv_) {
      MPI_Count got = 0;
      MPI_Get_elements_x(&st, type_->type(), &got);
      if (static_cast<size_t>(got) != bytes_) {
        error_ = concat("message size mismatch: ", core_->who(), " receives ", bytes_,
                        " bytes from rank ", peer_, " (tag ", tag_, ") but the message has ", got);
        throw CommError(error_);
      }
    }
    done_ = true;
  }

  // Withdraws a pending op so MPI no longer touches its buffer.
  // A receive that MPI has already matched to a message cannot be cancelled, only completed: it
  // is polled for a bounded time (a live peer finishes sending), and one whose peer has stopped
  // mid-message is released to MPI unfinished instead of blocking forever in MPI_Wait (that only
  // happens after a failure or timeout, when the job is ending).
  void cancel() noexcept {
    if (req_ == MPI_REQUEST_NULL || mpi_finalized()) return;
    if (is_recv_) {
      MPI_Cancel(&req_);
      const auto give_up = Clock::now() + kCancelGrace;
      int done = 0;
      while (MPI_Test(&req_, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done &&
             Clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      if (!done && req_ != MPI_REQUEST_NULL) MPI_Request_free(&req_);
    } else {
      MPI_Request_free(&req_);  // a send completes (or not) on its own
    }
    req_ = MPI_REQUEST_NULL;
  }
  static constexpr std::chrono::seconds kCancelGrace{2};

  std::shared_ptr<MpiCore> core_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  bool is_recv_;
  size_t bytes_;
  int peer_, tag_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<ByteType> type_;
  bool done_ = false;
  std::string error_;
};

MPI_Datatype mpi_elem_type(Communicator::Elem e) {
  switch (e) {
    case Communicator::Elem::kF32:
      return MPI_FLOAT;
    case Communicator::Elem::kF64:
      return MPI_DOUBLE;
    case Communicator::Elem::kI64:
      return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::shared_ptr<MpiWorld> world, bool is_world,
                  std::chrono::milliseconds timeout)
      : core_(std::make_shared<MpiCore>()) {
    core_->comm = comm;
    core_->world = std::move(world);
    core_->is_world = is_world;
    MPI_Comm_rank(comm, &core_->rank);
    MPI_Comm_size(comm, &core_->size);
    core_->link.stats = &stats_;
    timeout_ = timeout;
  }
  ~MpiCommunicator() override { core_->link.stats = nullptr; }

  int rank() const override { return core_->rank; }
  int size() const override { return core_->size; }
  std::string backend() const override { return "mpi"; }

  Request isend(const void* buf, size_t bytes, int dst, int tag) override;
  Request irecv(void* buf, size_t bytes, int src, int tag) override;
  void all_gather(const void* send, size_t bytes, void* recv) override;
  void all_gatherv(const void* send, void* recv, std::span<const size_t> counts) override;
  void all_to_all(const void* send, void* recv, size_t bytes_per_rank) override;
  void all_to_allv(const void* send, std::span<const size_t> send_counts, void* recv,
                   std::span<const size_t> recv_counts) override;
  void all_reduce(void* buf, size_t n, Elem elem, ReduceOp op) override;
  using Communicator::all_reduce;
  void broadcast(void* buf, size_t bytes, int root) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  void abort(const std::string& message) override { core_->world->abort(message); }
  std::pair<int, std::string> peer_abort(std::chrono::milliseconds grace) override {
    return core_->world->peer_abort(grace);
  }

 private:
  // Checks the calling thread and that no failure is known, before posting an op.
  void begin_op() {
    require_mpi_thread();
    core_->world->check();
  }
  // Waits for a posted collective; on failure its arguments are kept alive (MPI may still read
  // them: a collective cannot be cancelled).
  void finish_collective(MPI_Request* req, const std::string& what, std::shared_ptr<CollArgs> args,
                         Clock::time_point deadline) {
    try {
      core_->progress(req, MPI_STATUS_IGNORE, what, deadline, timeout(), true);
    } catch (...) {
      std::lock_guard<std::mutex> lk(g_keep_alive_mu);
      if (args) g_abandoned.push_back(std::move(args));
      throw;
    }
  }
  std::string group_what(OpKind op) const {
    return concat(op_kind_name(op), " (group of ", size(), ")");
  }

  std::shared_ptr<MpiCore> core_;
};

Request MpiCommunicator::isend(const void* buf, size_t bytes, int dst, int tag) {
  rules::check_isend(buf, bytes, dst, tag, size());
  begin_op();
  rules::account_send(stats_, bytes, dst == rank());
  auto type = std::make_unique<ByteType>(bytes);
  const int count = type->count();
  const MPI_Datatype dt = type->type();
  auto req =
      std::make_shared<MpiRequest>(core_, false, bytes, dst, tag, timeout(), std::move(type));
  check_mpi(MPI_Isend(buf, count, dt, dst, tag, core_->comm, req->handle()), "MPI_Isend");
  return Request(std::move(req));
}

Request MpiCommunicator::irecv(void* buf, size_t bytes, int src, int tag) {
  rules::check_irecv(buf, bytes, src, tag, size());
  begin_op();
  rules::account_recv(stats_, bytes, src == rank());
  auto type = std::make_unique<ByteType>(bytes);
  const int count = type->count();
  const MPI_Datatype dt = type->type();
  auto req = std::make_shared<MpiRequest>(core_, true, bytes, src, tag, timeout(), std::move(type));
  check_mpi(MPI_Irecv(buf, count, dt, src, tag, core_->comm, req->handle()), "MPI_Irecv");
  return Request(std::move(req));
}

// Collectives with small buffers (at most g_stage_bytes in all, the same decision on every rank)
// run on a staging copy held by CollArgs: if the collective fails, MPI cannot be stopped from
// completing parts of it later, and it must not write into memory the caller has freed. Large
// collectives use the caller's buffers (zero copy); see docs/communication.md.

void MpiCommunicator::all_gather(const void* send, size_t bytes, void* recv) {
  rules::CollectiveTrace trace_op(OpKind::kAllGather, stats_);
  rules::check_all_gather(send, bytes, recv, rank(), size());
  begin_op();
  rules::account_all_gather(stats_, bytes, size());
  rules::WaitClock clock(&stats_);
  const auto deadline = Clock::now() + timeout();
  const size_t total = bytes * static_cast<size_t>(size());
  const size_t mine = bytes * static_cast<size_t>(rank());
  auto args = std::make_shared<CollArgs>();
  const bool staged = total <= g_stage_bytes;
  char* out = staged ? args->make_stage(total) : static_cast<char*>(recv);
  if (staged && bytes > 0) std::memcpy(out + mine, send, bytes);
  const bool in_place = staged || send == out + mine;
  auto& t = *args->owned.emplace_back(std::make_unique<ByteType>(bytes));
  MPI_Request req;
  check_mpi(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, t.count(), t.type(), out, t.count(),
                           t.type(), core_->comm, &req),
            "MPI_Iallgather");
  finish_collective(&req, group_what(OpKind::kAllGather), args, deadline);
  if (staged && total > 0) std::memcpy(recv, out, total);
}

void MpiCommunicator::all_gatherv(const void* send, void* recv, std::span<const size_t> counts) {
  rules::CollectiveTrace trace_op(OpKind::kAllGatherV, stats_);
  rules::check_all_gatherv(send, recv, counts, rank(), size());
  begin_op();
  rules::account_all_gatherv(stats_, counts, rank());
  rules::WaitClock clock(&stats_);
  const auto deadline = Clock::now() + timeout();
  const int n = size(), me = rank();
  std::vector<size_t> offsets(static_cast<size_t>(n) + 1, 0);
  for (int i = 0; i < n; ++i) offsets[i + 1] = offsets[i] + counts[i];
  const size_t total = offsets[n];
  auto args = std::make_shared<CollArgs>();
  const bool staged = total <= g_stage_bytes;
  char* out = staged ? args->make_stage(total) : static_cast<char*>(recv);
  if (staged && counts[me] > 0) std::memcpy(out + offsets[me], send, counts[me]);
  const bool in_place = staged || send == out + offsets[me];
  MPI_Request req;
  if (total <= g_max_count) {
    // counts and displacements fit in int
    args->ints.resize(2 * static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      args->ints[i] = to_int(counts[i]);
      args->ints[n + i] = to_int(offsets[i]);
    }
    check_mpi(
        MPI_Iallgatherv(in_place ? MPI_IN_PLACE : send, to_int(counts[me]), MPI_BYTE, out,
                        args->ints.data(), args->ints.data() + n, MPI_BYTE, core_->comm, &req),
        "MPI_Iallgatherv");
  } else {
    // Large: one alltoallw whose per-peer types carry the byte offsets; own block copied here.
    if (!in_place && counts[me] > 0) std::memcpy(out + offsets[me], send, counts[me]);
    // Send this rank's block from its place in `out`, but never through a pointer equal to
    // `out`: libnbc takes sendbuf == recvbuf for MPI_IN_PLACE, which means something else here.
    char* sbuf = out + offsets[me];
    MPI_Aint sdisp = 0;
    if (sbuf == out) {
      sbuf = out + 1;
      sdisp = -1;
    }
    args->ints.assign(4 * static_cast<size_t>(n), 0);  // scounts, sdispls, rcounts, rdispls
    args->types.assign(2 * static_cast<size_t>(n), MPI_BYTE);
    auto& own = *args->owned.emplace_back(std::make_unique<ByteType>(counts[me], sdisp));
    for (int i = 0; i < n; ++i) {
      if (i == me) continue;
      args->ints[i] = counts[me] > 0 ? 1 : 0;
      args->types[i] = own.type();
      auto& t = *args->owned.emplace_back(
          std::make_unique<ByteType>(counts[i], static_cast<MPI_Aint>(offsets[i])));
      args->ints[2 * n + i] = counts[i] > 0 ? 1 : 0;
      args->types[n + i] = t.type();
    }
    int* ints = args->ints.data();
    check_mpi(MPI_Ialltoallw(sbuf, ints, ints + n, args->types.data(), out, ints + 2 * n,
                             ints + 3 * n, args->types.data() + n, core_->comm, &req),
              "MPI_Ialltoallw");
  }
  finish_collective(&req, group_what(OpKind::kAllGatherV), args, deadline);
  if (staged && total > 0) std::memcpy(recv, out, total);
}

void MpiCommunicator::all_to_all(const void* send, void* recv, size_t bytes_per_rank) {
  rules::CollectiveTrace trace_op(OpKind::kAllToAll, stats_);
  const size_t total = bytes_per_rank * static_cast<size_t>(size());
  rules::check_all_to_all(send, recv, bytes_per_rank, size());
  begin_op();
  rules::account_all_to_all(stats_, bytes_per_rank, size());
  rules::WaitClock clock(&stats_);
  const auto deadline = Clock::now() + timeout();
  auto args = std::make_shared<CollArgs>();
  const bool staged = 2 * total <= g_stage_bytes;
  const void* in = send;
  void* out = recv;
  if (staged) {  // [send | 1 byte | recv]: in != out even when empty (see distinct_buffers)
    char* stage = args->make_stage(2 * total + 1);
    if (total > 0) std::memcpy(stage, send, total);
    in = stage;
    out = stage + total + 1;
  }
  distinct_buffers(in, total, out);
  auto& t = *args->owned.emplace_back(std::make_unique<ByteType>(bytes_per_rank));
  MPI_Request req;
  check_mpi(MPI_Ialltoall(in, t.count(), t.type(), out, t.count(), t.type(), core_->comm, &req),
            "MPI_Ialltoall");
  finish_collective(&req, group_what(OpKind::kAllToAll), args, deadline);
  if (staged && total > 0) std::memcpy(recv, out, total);
}

void MpiCommunicator::all_to_allv(const void* send, std::span<const size_t> send_counts, void* recv,
                                  std::span<const size_t> recv_counts) {
  rules::CollectiveTrace trace_op(OpKind::kAllToAllV, stats_);
  rules::check_all_to_allv(send, send_counts, recv, recv_counts, size());
  const int n = size();
  std::vector<size_t> soff(static_cast<size_t>(n) + 1, 0), roff(static_cast<size_t>(n) + 1, 0);
  for (int i = 0; i < n; ++i) {
    soff[i + 1] = soff[i] + send_counts[i];
    roff[i + 1] = roff[i] + recv_counts[i];
  }
  begin_op();
  rules::account_all_to_allv(stats_, send_counts, recv_counts, rank());
  rules::WaitClock clock(&stats_);
  const auto deadline = Clock::now() + timeout();
  // One MPI_Ialltoallw whatever the sizes: which path a rank takes must not depend on its own
  // counts (other ranks cannot know them), and alltoallw takes a datatype per peer. A block whose
  // count and byte offset fit in int travels as MPI_BYTE; a larger one as a derived type that
  // carries its offset (displacement 0).
  auto args = std::make_shared<CollArgs>();
  const bool staged = soff[n] + roff[n] <= g_stage_bytes;  // a local choice: only pointers differ
  const void* in = send;
  void* out = recv;
  if (staged) {  // [send | 1 byte | recv]
    char* stage = args->make_stage(soff[n] + roff[n] + 1);
    if (soff[n] > 0) std::memcpy(stage, send, soff[n]);
    in = stage;
    out = stage + soff[n] + 1;
  }
  distinct_buffers(in, soff[n], out);
  args->ints.assign(4 * static_cast<size_t>(n), 0);  // scounts, sdispls, rcounts, rdispls
  args->types.assign(2 * static_cast<size_t>(n), MPI_BYTE);
  int* ints = args->ints.data();
  auto describe = [&](size_t count, size_t offset, int* c, int* displ, MPI_Datatype* type) {
    if (count == 0) return;
    if (count <= g_max_count && offset <= g_max_count) {
      *c = to_int(count);
      *displ = to_int(offset);
    } else {
      auto& t = *args->owned.emplace_back(
          std::make_unique<ByteType>(count, static_cast<MPI_Aint>(offset)));
      *c = 1;
      *type = t.type();
    }
  };
  for (int i = 0; i < n; ++i) {
    describe(send_counts[i], soff[i], &ints[i], &ints[n + i], &args->types[i]);
    describe(recv_counts[i], roff[i], &ints[2 * n + i], &ints[3 * n + i], &args->types[n + i]);
  }
  MPI_Request req;
  check_mpi(MPI_Ialltoallw(in, ints, ints + n, args->types.data(), out, ints + 2 * n, ints + 3 * n,
                           args->types.data() + n, core_->comm, &req),
            "MPI_Ialltoallw");
  finish_collective(&req, group_what(OpKind::kAllToAllV), args, deadline);
  if (staged && roff[n] > 0) std::memcpy(recv, out, roff[n]);
}

void MpiCommunicator::all_reduce(void* buf, size_t n, Elem elem, ReduceOp op) {
  rules::CollectiveTrace trace_op(OpKind::kAllReduce, stats_);
  rules::check_buffer(buf, n, "all_reduce: buf");
  begin_op();
  const size_t esize = rules::elem_size(elem);
  rules::account_all_reduce(stats_, n * esize, size());
  rules::WaitClock clock(&stats_);
  const auto deadline = Clock::now() + timeout();
  const MPI_Datatype type = mpi_elem_type(elem);
  const MPI_Op mpi_op = op == ReduceOp::kSum ? MPI_SUM : MPI_MAX;
  auto args = std::make_shared<CollArgs>();
  const bool staged = n * esize <= g_stage_bytes;
  char* data = static_cast<char*>(buf);
  if (staged) {
    data = args->make_stage(n * esize);
    if (n > 0) std::memcpy(data, buf, n * esize);
  }
  // One op per chunk of at most max-count elements (a single one unless n >= 2^31).
  size_t done = 0;
  do {
    const size_t m = std::min(n - done, g_max_count);
    MPI_Request req;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data + done * esize, to_int(m), type, mpi_op,
                             core_->comm, &req),
              "MPI_Iallreduce");
    finish_collective(&req, group_what(OpKind::kAllReduce), args, deadline);
    done += m;
  } while (done < n);
  if (staged && n > 0) std::memcpy(buf, data, n * esize);
}

void MpiCommunicator::broadcast(void* buf, size_t bytes, int root) {
  rules::CollectiveTrace trace_op(OpKind::kBroadcast, stats_);
  rules::check_broadcast(buf, bytes, root, size());
  begin_op();
  rules::account_broadcast(stats_, bytes, root, rank(), size());
  rules::WaitClock clock(&stats_);
  const auto deadline = Clock::now() + timeout();
  auto args = std::make_shared<CollArgs>();
  const bool staged = bytes <= g_stage_bytes;
  char* data = static_cast<char*>(buf);
  if (staged) {
    data = args->make_stage(bytes);
    if (rank() == root && bytes > 0) std::memcpy(data, buf, bytes);
  }
  auto& t = *args->owned.emplace_back(std::make_unique<ByteType>(bytes));
  MPI_Request req;
  check_mpi(MPI_Ibcast(data, t.count(), t.type(), root, core_->comm, &req), "MPI_Ibcast");
  finish_collective(&req, group_what(OpKind::kBroadcast), args, deadline);
  if (staged && rank() != root && bytes > 0) std::memcpy(buf, data, bytes);
}

void MpiCommunicator::barrier() {
  rules::CollectiveTrace trace_op(OpKind::kBarrier, stats_);
  begin_op();
  rules::account_barrier(stats_);
  rules::WaitClock clock(&stats_);
  const auto deadline = Clock::now() + timeout();
  MPI_Request req;
  check_mpi(MPI_Ibarrier(core_->comm, &req), "MPI_Ibarrier");
  finish_collective(&req, group_what(OpKind::kBarrier), nullptr, deadline);
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  // Not counted in CommStats. MPI_Comm_split blocks without a deadline, so first make sure
  // every rank has arrived with a bounded, failure-aware all-gather of (color, key).
  begin_op();
  const auto deadline = Clock::now() + timeout();
  auto args = std::make_shared<CollArgs>();
  args->ints.resize(2 * static_cast<size_t>(size()) + 2);
  args->ints[0] = color;
  args->ints[1] = key;
  MPI_Request req;
  check_mpi(MPI_Iallgather(args->ints.data(), 2, MPI_INT, args->ints.data() + 2, 2, MPI_INT,
                           core_->comm, &req),
            "MPI_Iallgather");
  finish_collective(&req, group_what(OpKind::kSplit), args, deadline);
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(core_->comm, color < 0 ? MPI_UNDEFINED : color, key, &comm),
            "MPI_Comm_split");
  if (comm == MPI_COMM_NULL) return nullptr;
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return std::make_unique<MpiCommunicator>(comm, core_->world, false, timeout());
}

}  // namespace

namespace mpi_detail {
Limits default_limits() { return {size_t{INT_MAX}, kDefaultStageBytes}; }

Limits set_limits_for_testing(Limits limits) {
  const Limits old{g_max_count, g_stage_bytes};
  g_max_count = std::clamp<size_t>(limits.max_count, 1, INT_MAX);
  g_stage_bytes = limits.stage_bytes;
  return old;
}
}  // namespace mpi_detail

bool mpi_available() { return true; }

void mpi_init(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) throw CommError("MPI_Init_thread failed: " + mpi_error_string(rc));
    SEQPAR_CHECK(provided >= MPI_THREAD_FUNNELED, "MPI provides thread level ", provided,
                 ", seqpar needs MPI_THREAD_FUNNELED");
    g_mpi_thread = std::this_thread::get_id();
    std::atexit([] { mpi_finalize(); });
  } else if (g_mpi_thread == std::thread::id()) {
    g_mpi_thread = std::this_thread::get_id();  // MPI initialized by the application
  }
}

void mpi_finalize() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized && !mpi_finalized()) MPI_Finalize();
}

bool mpi_launched() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

namespace {

// The MPI_Comm whose handle has this value: Open MPI's handles are pointers, MPICH's integers.
template <typename Comm>
Comm comm_from_handle(std::uintptr_t handle) {
  if constexpr (std::is_pointer_v<Comm>)
    return reinterpret_cast<Comm>(handle);
  else
    return static_cast<Comm>(handle);
}

// A communicator over duplicates of `base` (one for the ops, one for failure messages).
std::unique_ptr<Communicator> duplicate(MPI_Comm base, const char* what) {
  require_mpi_thread();
  // Non-blocking duplicates, so a rank that never arrives cannot hang the others.
  const auto timeout = Communicator::default_timeout();
  const auto deadline = Clock::now() + timeout;
  MPI_Comm comms[2] = {MPI_COMM_NULL, MPI_COMM_NULL};
  MPI_Request reqs[2];
  check_mpi(MPI_Comm_idup(base, &comms[0], &reqs[0]), "MPI_Comm_idup");
  check_mpi(MPI_Comm_idup(base, &comms[1], &reqs[1]), "MPI_Comm_idup");
  for (;;) {
    int done = 0;
    check_mpi(MPI_Testall(2, reqs, &done, MPI_STATUSES_IGNORE), "MPI_Comm_idup");
    if (done) break;
    if (Clock::now() >= deadline) {
      int rank = 0;
      MPI_Comm_rank(base, &rank);
      throw CommTimeout(rules::timeout_message(timeout, concat("rank ", rank), what));
    }
    sched_yield();
  }
  MPI_Comm_set_errhandler(comms[0], MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(comms[1], MPI_ERRORS_RETURN);
  auto world = std::make_shared<MpiWorld>(comms[1]);
  return std::make_unique<MpiCommunicator>(comms[0], std::move(world), true, timeout);
}

}  // namespace

std::unique_ptr<Communicator> mpi_world() {
  return duplicate(MPI_COMM_WORLD, "mpi_world (duplicating MPI_COMM_WORLD)");
}

std::unique_ptr<Communicator> mpi_communicator(std::uintptr_t handle) {
  static_assert(sizeof(MPI_Comm) <= sizeof(std::uintptr_t));
  const MPI_Comm base = comm_from_handle<MPI_Comm>(handle);
  SEQPAR_ARG_CHECK(base != MPI_COMM_NULL, "mpi_communicator: the communicator is MPI_COMM_NULL");
  return duplicate(base, "mpi_communicator (duplicating the application's communicator)");
}

}  // namespace seqpar
