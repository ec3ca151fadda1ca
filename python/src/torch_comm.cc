// seqpar.TorchComm: a Communicator over a torch.distributed process group (gloo, CPU tensors),
// so a script launched by torchrun, like the peers that launch that way (ring-flash-attention,
// yunchang, xDiT), shares its world with seqpar.
//
// Every op views the caller's memory as a uint8 (all_reduce: fp32, fp64, int64) tensor without a
// copy (torch.frombuffer over a memoryview; an empty tensor for 0 bytes) and posts the matching
// torch.distributed op with async_op=True, holding the GIL only inside the call:
//   isend, irecv    dist.isend, dist.irecv (to self: a local mailbox, as gloo refuses self
//                   sends; 0 bytes: nothing moves, both sides skip alike)
//   all_gather      dist.all_gather_into_tensor
//   all_gatherv     equal counts: all_gather_into_tensor; else dist.all_to_all_single sending
//                   this rank's block to every rank (gloo's all_gather takes one size only)
//   all_to_all(v)   dist.all_to_all_single (with split sizes)
//   all_reduce      dist.all_reduce (SUM, MAX)
//   broadcast       dist.broadcast;  barrier: dist.barrier
//   split           an all-gather of (color, key), then dist.new_group per color, ascending
// Waiting: a collective's Work is polled (is_completed, the GIL released between polls) until
// it is done, its deadline passes, or another rank announced a failure. torch offers no
// completion test of a point-to-point Work, so a Request's wait hands Work.wait(deadline) to a
// thread (one per communicator) and polls the same way meanwhile.
// A peer process that ends closes its gloo connections, but gloo does not end a wait whose
// message was in flight on that connection (seen with torch 2.8: a send then waits out the
// deadline). So a wait longer than kProbeAfter also checks, every kProbeEvery, the connection to
// each rank it waits on: an irecv of a tag no op uses (kProbeTag) throws at once when gloo has
// closed that connection, and is otherwise left posted (a few bytes in gloo on either side).
// abort(message) writes "<rank>\n<message>" under this world's key in the default group's store
// (the torchrun rendezvous store); every op start and every collective poll reads the key (at
// most every kStorePoll), so the other ranks fail with CommError "rank R failed: message".
// Timeouts and failed torch calls abort the world the same way.
// CommStats count the logical transfers of op_rules.h, as every backend does.
// A collective abandoned after a failure keeps its Work (and tensors) alive for good; gloo may
// still write into the caller's buffer while the job ends (large MPI collectives alike).
//
// Thread-safety: a communicator is used by its rank's thread, a Python thread (torchrun: the main
// thread); the library calls it without the GIL and every op takes the GIL itself. Python
// objects held here are released with the GIL taken, from whichever thread drops them.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gil.h"
#include "op_rules.h"
#include "seqpar/comm/communicator.h"
#include "trace_op.h"

namespace py = pybind11;

namespace seqpar::python {
namespace {

namespace rules = comm_rules;
using Clock = std::chrono::steady_clock;
using detail::concat;

// How often a waiting rank reads the abort key of the store (a round trip to the store's host).
constexpr auto kStorePoll = std::chrono::milliseconds(20);
// When a waiting rank begins to check the connections to the ranks it waits on, and how often.
constexpr auto kProbeAfter = std::chrono::milliseconds(500);
constexpr auto kProbeEvery = std::chrono::milliseconds(500);
// The tag of those checks (the library's tags are small).
constexpr int kProbeTag = 0x7fffffff;

// A reference to a Python object held by C++ code that may run without the GIL: dropped with the
// GIL taken, or leaked once the interpreter is exiting (Python objects are gone then).
class PyRef {
 public:
  PyRef() = default;
  explicit PyRef(py::object o) : p_(o.release().ptr()) {}
  PyRef(PyRef&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  PyRef& operator=(PyRef&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef() { reset(); }

  py::handle get() const { return p_; }  // with the GIL held
  explicit operator bool() const { return p_ != nullptr; }

  void reset() noexcept {
    PyObject* p = std::exchange(p_, nullptr);
    if (p == nullptr || interpreter_exiting()) return;
    const PyGILState_STATE state = PyGILState_Ensure();
    Py_DECREF(p);
    PyGILState_Release(state);
  }

 private:
  PyObject* p_ = nullptr;
};

// What the ops call in torch, looked up once (GIL held; never freed: used until exit).
struct TorchApi {
  py::object dist, frombuffer, empty, timedelta, uint8, sum, max;
  py::object elem_dtypes[3];  // Communicator::Elem: kF32, kF64, kI64
  py::object probe;           // the buffer of the connection checks (never written)
};

const TorchApi& torch_api() {
  static TorchApi* api = [] {
    auto* a = new TorchApi;
    const py::module_ torch = py::module_::import("torch");
    a->dist = py::module_::import("torch.distributed");
    a->frombuffer = torch.attr("frombuffer");
    a->empty = torch.attr("empty");
    a->timedelta = py::module_::import("datetime").attr("timedelta");
    a->uint8 = torch.attr("uint8");
    a->sum = a->dist.attr("ReduceOp").attr("SUM");
    a->max = a->dist.attr("ReduceOp").attr("MAX");
    a->elem_dtypes[0] = torch.attr("float32");
    a->elem_dtypes[1] = torch.attr("float64");
    a->elem_dtypes[2] = torch.attr("int64");
    a->probe = a->empty(1, py::arg("dtype") = a->uint8);
    return a;
  }();
  return *api;
}

// `n` elements of `dtype` at p as a tensor over the same memory (no copy); an empty tensor for 0.
py::object tensor_view(const void* p, size_t bytes, const py::object& dtype) {
  const TorchApi& t = torch_api();
  if (bytes == 0) return t.empty(0, py::arg("dtype") = dtype);
  return t.frombuffer(
      py::memoryview::from_memory(const_cast<void*>(p), static_cast<py::ssize_t>(bytes)),
      py::arg("dtype") = dtype);
}
py::object byte_view(const void* p, size_t bytes) {
  return tensor_view(p, bytes, torch_api().uint8);
}

py::object timedelta(std::chrono::milliseconds t) {
  return torch_api().timedelta(py::arg("milliseconds") = std::max<int64_t>(1, t.count()));
}

// The first line of a Python exception's message, for a one-line CommError.
std::string first_line(const py::error_already_set& e) {
  std::string s = e.what();
  const size_t nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

// Works of collectives abandoned after a failure: gloo may still complete them, so they (and the
// tensors they hold) live until the process exits.
void abandon(py::object work) {
  static auto* kept = new std::vector<PyRef>;
  kept->emplace_back(std::move(work));
}

// The connection of `group` to global rank `peer` as gloo sees it: empty while open, else the
// first line of gloo's error ("Connection closed by peer ..."). GIL held.
std::string connection_error(py::handle group, int peer) {
  const TorchApi& t = torch_api();
  try {
    t.dist.attr("irecv")(t.probe, peer, py::arg("group") = group, py::arg("tag") = kProbeTag);
    return {};
  } catch (const py::error_already_set& e) {
    return first_line(e);
  }
}

// Waits for point-to-point Works, one at a time in the order given, on a thread of its own
// started at the first; the rank's thread polls a Job meanwhile. A Job its rank stopped waiting
// for (after a failure) keeps its Work until gloo ends the wait (its deadline at the latest).
// The thread holds the GIL only to call Work.wait (whose binding releases it while waiting) and
// ends without Python, so ending it never races the interpreter's exit. A wait that returns
// while the interpreter exits (a Job abandoned after a failure whose wait ends in those
// milliseconds) is ended there by CPython.
class Waiter {
 public:
  struct Job {
    PyRef work;
    std::chrono::milliseconds timeout;
    bool done = false;  // done and error: under the waiter's mutex
    std::string error;  // the first line of Work.wait's exception
  };

  Waiter() : s_(std::make_shared<State>()) {}
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;
  // The thread ends once it has no job; it is not waited for (a Job may hold it until its
  // deadline).
  ~Waiter() {
    {
      std::lock_guard<std::mutex> lock(s_->m);
      s_->stop = true;
    }
    s_->posted.notify_all();
    if (thread_.joinable()) thread_.detach();
  }

  std::shared_ptr<Job> submit(PyRef work, std::chrono::milliseconds timeout) {
    if (!thread_.joinable()) thread_ = std::thread(serve, s_);
    auto job = std::make_shared<Job>();
    job->work = std::move(work);
    job->timeout = timeout;
    {
      std::lock_guard<std::mutex> lock(s_->m);
      s_->jobs.push_back(job);
    }
    s_->posted.notify_one();
    return job;
  }

  // Whether `job` is done, waiting for it at most `limit` (without the GIL).
  bool wait_for(const Job& job, std::chrono::microseconds limit) {
    std::unique_lock<std::mutex> lock(s_->m);
    return s_->finished.wait_for(lock, limit, [&] { return job.done; });
  }

 private:
  struct State {
    std::mutex m;
    std::condition_variable posted, finished;
    std::deque<std::shared_ptr<Job>> jobs;
    bool stop = false;
  };

  static void serve(std::shared_ptr<State> s) {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(s->m);
        s->posted.wait(lock, [&] { return s->stop || !s->jobs.empty(); });
        if (s->jobs.empty()) return;  // stopped with nothing to wait for
        job = std::move(s->jobs.front());
        s->jobs.pop_front();
      }
      std::string error;
      {
        py::gil_scoped_acquire gil;
        try {
          job->work.get().attr("wait")(timedelta(job->timeout));
        } catch (const py::error_already_set& e) {
          error = first_line(e);
          if (error.empty()) error = "Work.wait failed";
        }
        job->work.reset();
      }
      // Done only now: the rank's thread may go on to the interpreter's exit, and this thread
      // touches no Python object after.
      {
        std::lock_guard<std::mutex> lock(s->m);
        job->error = std::move(error);
        job->done = true;
      }
      s->finished.notify_all();
    }
  }

  std::shared_ptr<State> s_;
  std::thread thread_;
};

// What a TorchComm and every communicator split from it share: the abort key in the store and
// this rank's knowledge of a failure. Used with the GIL held.
class TorchWorld {
 public:
  TorchWorld(PyRef store, std::string key, int rank)
      : store_(std::move(store)), key_(std::move(key)), rank_(rank) {}

  int rank() const { return rank_; }

  // Throws CommError if this rank failed, or PeerFailed if another rank announced a failure
  // (the store is read when `now` or at most every kStorePoll).
  void check(bool now = false) {
    const auto t = Clock::now();
    if (!failed_ && store_ && (now || t - last_poll_ >= kStorePoll)) {
      last_poll_ = t;
      try {
        py::list keys;
        keys.append(key_);
        if (store_.get().attr("check")(keys).cast<bool>()) {
          const std::string text = store_.get().attr("get")(key_).cast<std::string>();
          const size_t nl = text.find('\n');
          failed_ = peer_failed_ = true;
          failure_ =
              rules::peer_failed_message(std::atoi(text.substr(0, nl).c_str()),
                                         nl == std::string::npos ? text : text.substr(nl + 1));
        }
      } catch (const py::error_already_set&) {
        // The store's host is gone (the launcher ended): nothing to learn from it.
      }
    }
    if (!failed_) return;
    if (peer_failed_) throw PeerFailed(failure_);
    throw CommError(failure_);
  }

  // Announces this rank's failure to every rank. Best effort; never throws.
  void abort(const std::string& message) noexcept {
    if (failed_) return;  // already failed, or a peer's failure is known: nothing new to tell
    failed_ = true;
    failure_ = rules::peer_failed_message(rank_, message);
    if (!store_ || interpreter_exiting()) return;
    try {
      py::gil_scoped_acquire gil;
      store_.get().attr("set")(key_, concat(rank_, '\n', message));
    } catch (...) {
    }
  }

 private:
  PyRef store_;
  std::string key_;
  int rank_;
  bool failed_ = false, peer_failed_ = false;
  std::string failure_;
  Clock::time_point last_poll_{};
};

// A message to or from this rank itself, matched in posting order per tag.
struct SelfMessage {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t bytes = 0;
  int tag = 0;
  bool done = false;
  std::string error;
};

// The process group of one communicator, kept alive by its pending requests.
struct TorchCore {
  PyRef group;
  std::vector<int> members;  // global rank of each rank of this communicator
  int rank = 0, size = 1;
  bool is_world = false;
  std::shared_ptr<TorchWorld> world;
  rules::StatsLink link;
  std::deque<std::shared_ptr<SelfMessage>> self_sends, self_recvs;  // not yet matched
  Waiter waiter;

  std::string who() const { return rules::rank_label(rank, world->rank(), is_world); }
};

// What a waiting rank checks between polls (GIL held): a failure another rank announced, the
// connections to the ranks it waits on (from kProbeAfter on), the deadline and Ctrl-C. check()
// throws PeerFailed, CommError or CommTimeout naming the failure (announced to the others when
// it is this rank's), or error_already_set for Ctrl-C.
class WaitWatch {
 public:
  WaitWatch(TorchCore& core, std::string what, std::vector<int> peers,
            std::chrono::milliseconds timeout)
      : core_(core),
        what_(std::move(what)),
        peers_(std::move(peers)),
        timeout_(timeout),
        start_(Clock::now()),
        next_probe_(start_ + kProbeAfter) {}

  void check() {
    core_.world->check();
    const auto now = Clock::now();
    if (now >= next_probe_) {
      next_probe_ = now + kProbeEvery;
      for (int peer : peers_) {
        const std::string closed = connection_error(core_.group.get(), core_.members[peer]);
        if (closed.empty()) continue;
        core_.world->check(true);  // the peer's own message, if it announced one before ending
        fail(concat(core_.who(), " ", what_, " failed: the connection to rank ", peer,
                    " is closed (", closed, ")"));
      }
    }
    if (now - start_ >= timeout_) {
      const std::string msg = rules::timeout_message(timeout_, core_.who(), what_);
      core_.world->abort(msg);
      throw CommTimeout(msg);
    }
    if (PyErr_CheckSignals() != 0) {  // Ctrl-C on the main thread: stop, tell the others
      core_.world->abort(concat("interrupted in ", what_));
      throw py::error_already_set();
    }
  }

  // Whether the deadline has passed.
  bool expired() const { return Clock::now() - start_ >= timeout_; }

 private:
  [[noreturn]] void fail(const std::string& msg) {
    core_.world->abort(msg);
    throw CommError(msg);
  }

  TorchCore& core_;
  std::string what_;
  std::vector<int> peers_;  // ranks of the communicator
  std::chrono::milliseconds timeout_;
  Clock::time_point start_, next_probe_;
};

class TorchRequest final : public RequestImpl {
 public:
  TorchRequest(std::shared_ptr<TorchCore> core, PyRef work, bool is_recv, size_t bytes, int peer,
               int tag, std::chrono::milliseconds timeout)
      : core_(std::move(core)),
        work_(std::move(work)),
        is_recv_(is_recv),
        bytes_(bytes),
        peer_(peer),
        tag_(tag),
        timeout_(timeout) {}
  // A Work dropped without a wait is kept: gloo may still complete it (a waited one is the
  // waiter's).
  ~TorchRequest() override {
    if (!done_ && work_ && !interpreter_exiting()) {
      py::gil_scoped_acquire gil;
      abandon(py::reinterpret_borrow<py::object>(work_.get()));
    }
  }

  void wait() override {
    if (done_) return;
    if (!error_.empty()) throw CommError(error_);
    trace::Scope span(!trace::enabled() ? std::string()
                      : is_recv_        ? concat("wait recv from ", peer_)
                                        : concat("wait send to ", peer_),
                      "comm", trace::Lane::kComm);
    span.arg("bytes", static_cast<int64_t>(bytes_));
    rules::WaitClock clock(core_->link.stats);
    std::optional<WaitWatch> watch;
    try {
      std::shared_ptr<Waiter::Job> job;
      {
        py::gil_scoped_acquire gil;
        core_->world->check();
        watch.emplace(*core_, describe(), std::vector<int>{peer_}, timeout_);
        job = core_->waiter.submit(std::move(work_), timeout_);
      }
      // Woken at once when done, without taking the GIL; between polls, the watch's checks.
      while (!core_->waiter.wait_for(*job, kStorePoll)) {
        py::gil_scoped_acquire gil;
        watch->check();
      }
      if (!job->error.empty()) {
        py::gil_scoped_acquire gil;
        core_->world->check(true);  // a peer that announced its failure, then exited
        if (watch->expired()) {
          const std::string msg = rules::timeout_message(timeout_, core_->who(), describe());
          core_->world->abort(msg);
          throw CommTimeout(msg);
        }
        const std::string msg = concat(core_->who(), " ", describe(), " failed: ", job->error);
        core_->world->abort(msg);
        throw CommError(msg);
      }
    } catch (const CommError& e) {
      error_ = e.what();
      throw;
    } catch (const py::error_already_set&) {
      error_ = concat(core_->who(), " ", describe(), " was interrupted");
      throw;
    }
    done_ = true;
  }

  // torch has no completion test of a point-to-point Work (is_completed turns true only once
  // waited for): done only after wait().
  bool test() override {
    if (!error_.empty()) throw CommError(error_);
    return done_;
  }

 private:
  std::string describe() const {
    return is_recv_ ? concat("recv from rank ", peer_, " (tag ", tag_, ")")
                    : concat("send to rank ", peer_, " (tag ", tag_, ")");
  }

  std::shared_ptr<TorchCore> core_;
  PyRef work_;
  bool is_recv_;
  size_t bytes_;
  int peer_, tag_;
  std::chrono::milliseconds timeout_;
  bool done_ = false;
  std::string error_;
};

// A send to or receive from this rank: complete once matched (a copy). Its wait cannot make the
// other side happen, so an unmatched one fails at once instead of waiting out the deadline.
class SelfRequest final : public RequestImpl {
 public:
  SelfRequest(std::shared_ptr<TorchCore> core, std::shared_ptr<SelfMessage> m, bool is_recv)
      : core_(std::move(core)), m_(std::move(m)), is_recv_(is_recv) {}
  void wait() override {
    if (test()) return;
    throw CommError(concat(core_->who(), is_recv_ ? " receives" : " sends", " ", m_->bytes,
                           " bytes from itself (tag ", m_->tag, ") but no matching ",
                           is_recv_ ? "isend" : "irecv", " was posted before this wait"));
  }
  bool test() override {
    if (!m_->error.empty()) throw CommError(m_->error);
    return m_->done;
  }

 private:
  std::shared_ptr<TorchCore> core_;
  std::shared_ptr<SelfMessage> m_;
  bool is_recv_;
};

class TorchCommunicator final : public Communicator {
 public:
  TorchCommunicator(PyRef group, std::vector<int> members, int rank,
                    std::shared_ptr<TorchWorld> world, bool is_world,
                    std::chrono::milliseconds timeout)
      : core_(std::make_shared<TorchCore>()) {
    core_->group = std::move(group);
    core_->members = std::move(members);
    core_->rank = rank;
    core_->size = static_cast<int>(core_->members.size());
    core_->world = std::move(world);
    core_->is_world = is_world;
    core_->link.stats = &stats_;
    timeout_ = timeout;
  }
  ~TorchCommunicator() override { core_->link.stats = nullptr; }

  int rank() const override { return core_->rank; }
  int size() const override { return core_->size; }
  std::string backend() const override { return "torch"; }

  Request isend(const void* buf, size_t bytes, int dst, int tag) override {
    rules::check_isend(buf, bytes, dst, tag, size());
    py::gil_scoped_acquire gil;
    begin_op();
    rules::account_send(stats_, bytes, dst == rank());
    if (dst == rank()) return self_message(false, buf, nullptr, bytes, tag);
    if (bytes == 0) return Request();
    return p2p("isend", byte_view(buf, bytes), false, bytes, dst, tag);
  }

  Request irecv(void* buf, size_t bytes, int src, int tag) override {
    rules::check_irecv(buf, bytes, src, tag, size());
    py::gil_scoped_acquire gil;
    begin_op();
    rules::account_recv(stats_, bytes, src == rank());
    if (src == rank()) return self_message(true, nullptr, buf, bytes, tag);
    if (bytes == 0) return Request();
    return p2p("irecv", byte_view(buf, bytes), true, bytes, src, tag);
  }

  void all_gather(const void* send, size_t bytes, void* recv) override {
    rules::CollectiveTrace trace_op(OpKind::kAllGather, stats_);
    rules::check_all_gather(send, bytes, recv, rank(), size());
    py::gil_scoped_acquire gil;
    begin_op();
    rules::account_all_gather(stats_, bytes, size());
    rules::WaitClock clock(&stats_);
    gather(OpKind::kAllGather, send, bytes, recv);
  }

  void all_gatherv(const void* send, void* recv, std::span<const size_t> counts) override {
    rules::CollectiveTrace trace_op(OpKind::kAllGatherV, stats_);
    rules::check_all_gatherv(send, recv, counts, rank(), size());
    py::gil_scoped_acquire gil;
    begin_op();
    rules::account_all_gatherv(stats_, counts, rank());
    rules::WaitClock clock(&stats_);
    const bool equal =
        std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; });
    if (equal) return gather(OpKind::kAllGatherV, send, counts[0], recv);
    // This rank's block to every rank (a copy per rank: send may lie inside recv).
    const size_t mine = counts[rank()], total = std::reduce(counts.begin(), counts.end());
    const py::object block = byte_view(send, mine).attr("repeat")(size());
    const std::vector<size_t> to_each(static_cast<size_t>(size()), mine);
    exchange(OpKind::kAllGatherV, block, to_each, byte_view(recv, total), counts);
  }

  void all_to_all(const void* send, void* recv, size_t bytes_per_rank) override {
    rules::CollectiveTrace trace_op(OpKind::kAllToAll, stats_);
    rules::check_all_to_all(send, recv, bytes_per_rank, size());
    py::gil_scoped_acquire gil;
    begin_op();
    rules::account_all_to_all(stats_, bytes_per_rank, size());
    rules::WaitClock clock(&stats_);
    const size_t total = bytes_per_rank * static_cast<size_t>(size());
    const std::vector<size_t> counts(static_cast<size_t>(size()), bytes_per_rank);
    exchange(OpKind::kAllToAll, byte_view(send, total), counts, byte_view(recv, total), counts);
  }

  void all_to_allv(const void* send, std::span<const size_t> send_counts, void* recv,
                   std::span<const size_t> recv_counts) override {
    rules::CollectiveTrace trace_op(OpKind::kAllToAllV, stats_);
    rules::check_all_to_allv(send, send_counts, recv, recv_counts, size());
    py::gil_scoped_acquire gil;
    begin_op();
    rules::account_all_to_allv(stats_, send_counts, recv_counts, rank());
    rules::WaitClock clock(&stats_);
    const size_t sent = std::reduce(send_counts.begin(), send_counts.end());
    const size_t got = std::reduce(recv_counts.begin(), recv_counts.end());
    exchange(OpKind::kAllToAllV, byte_view(send, sent), send_counts, byte_view(recv, got),
             recv_counts);
  }

  void all_reduce(void* buf, size_t n, Elem elem, ReduceOp op) override {
    rules::CollectiveTrace trace_op(OpKind::kAllReduce, stats_);
    rules::check_buffer(buf, n, "all_reduce: buf");
    py::gil_scoped_acquire gil;
    begin_op();
    const size_t bytes = n * rules::elem_size(elem);
    rules::account_all_reduce(stats_, bytes, size());
    rules::WaitClock clock(&stats_);
    if (n == 0) return;
    const TorchApi& t = torch_api();
    const py::object data = tensor_view(buf, bytes, t.elem_dtypes[static_cast<int>(elem)]);
    run(OpKind::kAllReduce, [&] {
      return t.dist.attr("all_reduce")(data, py::arg("op") = op == ReduceOp::kSum ? t.sum : t.max,
                                       py::arg("group") = group(), py::arg("async_op") = true);
    });
  }

  void broadcast(void* buf, size_t bytes, int root) override {
    rules::CollectiveTrace trace_op(OpKind::kBroadcast, stats_);
    rules::check_broadcast(buf, bytes, root, size());
    py::gil_scoped_acquire gil;
    begin_op();
    rules::account_broadcast(stats_, bytes, root, rank(), size());
    rules::WaitClock clock(&stats_);
    if (bytes == 0) return;
    const py::object data = byte_view(buf, bytes);
    run(OpKind::kBroadcast, [&] {
      return torch_api().dist.attr("broadcast")(data, py::arg("src") = core_->members[root],
                                                py::arg("group") = group(),
                                                py::arg("async_op") = true);
    });
  }

  void barrier() override {
    rules::CollectiveTrace trace_op(OpKind::kBarrier, stats_);
    py::gil_scoped_acquire gil;
    begin_op();
    rules::account_barrier(stats_);
    rules::WaitClock clock(&stats_);
    run(OpKind::kBarrier, [&] {
      return torch_api().dist.attr("barrier")(py::arg("group") = group(),
                                              py::arg("async_op") = true);
    });
  }

  std::unique_ptr<Communicator> split(int color, int key) override;

  void abort(const std::string& message) override { core_->world->abort(message); }

 private:
  py::handle group() const { return core_->group.get(); }

  // Before posting an op: no failure known (GIL held).
  void begin_op() { core_->world->check(); }

  std::string group_what(OpKind op) const {
    return concat(op_kind_name(op), " (group of ", size(), ")");
  }

  Request p2p(const char* name, py::object data, bool is_recv, size_t bytes, int peer, int tag) {
    const py::object& dist = torch_api().dist;
    py::object work;
    try {
      work = dist.attr(name)(data, core_->members[peer], py::arg("group") = group(),
                             py::arg("tag") = tag);
    } catch (const py::error_already_set& e) {
      const std::string msg = concat(core_->who(), " ", name, " with rank ", peer, " (tag ", tag,
                                     ") failed: ", first_line(e));
      core_->world->abort(msg);
      throw CommError(msg);
    }
    return Request(std::make_shared<TorchRequest>(core_, PyRef(std::move(work)), is_recv, bytes,
                                                  peer, tag, timeout()));
  }

  // An isend or irecv of this rank to itself: matches the oldest unmatched opposite op of the tag.
  Request self_message(bool is_recv, const void* send, void* recv, size_t bytes, int tag) {
    auto m = std::make_shared<SelfMessage>();
    m->send = send;
    m->recv = recv;
    m->bytes = bytes;
    m->tag = tag;
    auto& others = is_recv ? core_->self_sends : core_->self_recvs;
    auto& mine = is_recv ? core_->self_recvs : core_->self_sends;
    auto it =
        std::find_if(others.begin(), others.end(), [&](const auto& o) { return o->tag == tag; });
    if (it == others.end()) {
      mine.push_back(m);
    } else {
      const std::shared_ptr<SelfMessage> o = *it;
      others.erase(it);
      SelfMessage& s = is_recv ? *o : *m;
      SelfMessage& r = is_recv ? *m : *o;
      if (s.bytes != r.bytes) {
        s.error = r.error =
            concat("message size mismatch: ", core_->who(), " receives ", r.bytes,
                   " bytes from itself (tag ", tag, ") but the message has ", s.bytes);
      } else if (s.bytes > 0) {
        std::memcpy(r.recv, s.send, s.bytes);
      }
      s.done = r.done = true;
    }
    return Request(std::make_shared<SelfRequest>(core_, std::move(m), is_recv));
  }

  // all_gather of `bytes` per rank (send may be this rank's block of recv).
  void gather(OpKind kind, const void* send, size_t bytes, void* recv) {
    if (bytes == 0) return;
    const size_t total = bytes * static_cast<size_t>(size());
    const py::object out = byte_view(recv, total);
    py::object in = byte_view(send, bytes);
    const char* r = static_cast<const char*>(recv);
    const char* s = static_cast<const char*>(send);
    if (s + bytes > r && s < r + total) in = in.attr("clone")();  // in place: gloo copies it in
    run(kind, [&] {
      return torch_api().dist.attr("all_gather_into_tensor")(out, in, py::arg("group") = group(),
                                                             py::arg("async_op") = true);
    });
  }

  // dist.all_to_all_single with byte counts per rank.
  void exchange(OpKind kind, const py::object& in, std::span<const size_t> in_counts,
                const py::object& out, std::span<const size_t> out_counts) {
    const std::vector<size_t> ins(in_counts.begin(), in_counts.end());
    const std::vector<size_t> outs(out_counts.begin(), out_counts.end());
    run(kind, [&] {
      return torch_api().dist.attr("all_to_all_single")(
          out, in, py::arg("output_split_sizes") = outs, py::arg("input_split_sizes") = ins,
          py::arg("group") = group(), py::arg("async_op") = true);
    });
  }

  // Posts a collective and polls its Work until done, the deadline, or a known failure
  // (GIL held, released while sleeping between polls).
  template <typename Post>
  void run(OpKind kind, Post&& post) {
    std::vector<int> peers;
    for (int r = 0; r < size(); ++r)
      if (r != rank()) peers.push_back(r);
    WaitWatch watch(*core_, group_what(kind), std::move(peers), timeout());
    py::object work;
    try {
      work = post();
    } catch (const py::error_already_set& e) {
      fail(concat(core_->who(), " ", group_what(kind), " failed: ", first_line(e)));
    }
    for (uint64_t i = 0;; ++i) {
      bool done = false;
      try {
        done = work.attr("is_completed")().cast<bool>();
        if (done) work.attr("wait")();  // rethrows the op's failure
      } catch (const py::error_already_set& e) {
        abandon(std::move(work));
        check_peer_then_fail(
            concat(core_->who(), " ", group_what(kind), " failed: ", first_line(e)));
      }
      if (done) return;
      try {
        watch.check();
      } catch (...) {
        abandon(std::move(work));
        throw;
      }
      // Short sleeps first (latency), longer ones on long waits (other processes compute).
      const auto nap = i < 200    ? std::chrono::microseconds(20)
                       : i < 2000 ? std::chrono::microseconds(100)
                                  : std::chrono::microseconds(1000);
      without_gil([&] { std::this_thread::sleep_for(nap); });
    }
  }

  // A failed torch call: another rank's announced failure if there is one, else `msg` (which
  // is announced to the others).
  [[noreturn]] void check_peer_then_fail(const std::string& msg) {
    core_->world->check(true);
    fail(msg);
  }
  [[noreturn]] void fail(const std::string& msg) {
    core_->world->abort(msg);
    throw CommError(msg);
  }

  std::shared_ptr<TorchCore> core_;
};

// The number of process groups this process holds (-1 where torch does not say).
int64_t group_count(const py::object& dist) {
  try {
    return static_cast<int64_t>(
        py::len(dist.attr("distributed_c10d").attr("_world").attr("pg_names")));
  } catch (const py::error_already_set&) {
    return -1;
  }
}

std::unique_ptr<Communicator> TorchCommunicator::split(int color, int key) {
  // Not counted in CommStats (split moves none of the caller's bytes).
  py::gil_scoped_acquire gil;
  begin_op();
  const TorchApi& t = torch_api();
  const py::object& dist = t.dist;
  const int n = size();
  // torch.distributed names a group made with use_local_synchronization after the number of
  // groups the process holds: its members must agree on it.
  const int64_t groups = group_count(dist);
  std::vector<int64_t> mine = {color, key, groups}, all(3 * static_cast<size_t>(n));
  const py::object out = tensor_view(all.data(), all.size() * 8, t.elem_dtypes[2]);
  const py::object in = tensor_view(mine.data(), mine.size() * 8, t.elem_dtypes[2]);
  run(OpKind::kSplit, [&] {
    return dist.attr("all_gather_into_tensor")(out, in, py::arg("group") = group(),
                                               py::arg("async_op") = true);
  });
  std::vector<int> colors;
  for (int r = 0; r < n; ++r)
    if (all[3 * r] >= 0) colors.push_back(static_cast<int>(all[3 * r]));
  std::sort(colors.begin(), colors.end());
  colors.erase(std::unique(colors.begin(), colors.end()), colors.end());
  // A group over every rank of the default group is made by every rank (in ascending color
  // order); a split of a smaller group only by the new group's members.
  const bool whole = n == dist.attr("get_world_size")().cast<int>();
  PyRef made;
  std::vector<int> made_members;
  const std::chrono::milliseconds limit = timeout();
  for (int c : colors) {
    std::vector<int> ranks;  // old ranks, by (key, old rank)
    for (int r = 0; r < n; ++r)
      if (all[3 * r] == c) ranks.push_back(r);
    std::stable_sort(ranks.begin(), ranks.end(),
                     [&](int a, int b) { return all[3 * a + 1] < all[3 * b + 1]; });
    std::vector<int> global;
    for (int r : ranks) global.push_back(core_->members[r]);
    // torch orders a group's ranks by global rank; the communicator's order must be the same.
    SEQPAR_ARG_CHECK(std::is_sorted(global.begin(), global.end()), "split(color ", c,
                     "): the keys order the ranks unlike their torch.distributed ranks ",
                     rules::format_counts(std::vector<size_t>(global.begin(), global.end())),
                     "; a torch process group is ordered by global rank");
    const bool member = c == color;
    if (!whole && !member) continue;
    if (!whole) {
      // torch names a group made by its members alone after the number of groups each member
      // holds, so they must agree on it: a member holding fewer first makes groups of itself
      // alone until it holds as many as the others.
      int64_t most = groups;
      for (int r : ranks) most = std::max(most, all[3 * r + 2]);
      const py::list alone = py::cast(std::vector<int>{core_->members[rank()]});
      try {
        for (int64_t i = groups; i < most && groups >= 0; ++i)
          dist.attr("new_group")(alone, py::arg("timeout") = timedelta(limit),
                                 py::arg("backend") = "gloo",
                                 py::arg("use_local_synchronization") = true);
      } catch (const py::error_already_set& e) {
        fail(concat(core_->who(), " split: torch.distributed.new_group failed: ", first_line(e)));
      }
      const int64_t now = groups < 0 ? groups : group_count(dist);
      if (now != most)
        throw CommError(concat("split: ", core_->who(), " holds ", now,
                               " torch.distributed groups and another member of its new group ",
                               most,
                               "; torch names a group made by its members alone after that "
                               "number, so they must agree"));
    }
    py::object pg;
    try {
      pg = whole ? dist.attr("new_group")(global, py::arg("timeout") = timedelta(limit),
                                          py::arg("backend") = "gloo")
                 : dist.attr("new_group")(global, py::arg("timeout") = timedelta(limit),
                                          py::arg("backend") = "gloo",
                                          py::arg("use_local_synchronization") = true);
    } catch (const py::error_already_set& e) {
      fail(concat(core_->who(), " split: torch.distributed.new_group failed: ", first_line(e)));
    }
    if (member) {
      made = PyRef(std::move(pg));
      made_members = std::move(global);
    }
  }
  if (color < 0) return nullptr;
  const int new_rank =
      static_cast<int>(std::find(made_members.begin(), made_members.end(), core_->members[rank()]) -
                       made_members.begin());
  return std::make_unique<TorchCommunicator>(std::move(made), std::move(made_members), new_rank,
                                             core_->world, false, timeout());
}

}  // namespace

// seqpar.TorchComm(group): the communicator over a torch.distributed process group (None: the
// default group, initialized with gloo from torchrun's environment when no one did yet).
std::unique_ptr<Communicator> torch_communicator(py::object group) {
  py::module_ dist;
  try {
    dist = py::module_::import("torch.distributed");
  } catch (const py::error_already_set&) {
    throw InvalidArgument("TorchComm needs PyTorch (torch.distributed), which is not installed");
  }
  SEQPAR_ARG_CHECK(dist.attr("is_available")().cast<bool>(),
                   "TorchComm: this PyTorch has no torch.distributed");
  if (!dist.attr("is_initialized")().cast<bool>()) {
    const bool launched = std::getenv("MASTER_ADDR") != nullptr &&
                          std::getenv("WORLD_SIZE") != nullptr && std::getenv("RANK") != nullptr;
    SEQPAR_ARG_CHECK(
        launched,
        "TorchComm: torch.distributed is not initialized; call "
        "torch.distributed.init_process_group(\"gloo\") first or launch with torchrun");
    dist.attr("init_process_group")(py::arg("backend") = "gloo");
  }
  if (group.is_none()) group = dist.attr("group").attr("WORLD");
  const std::string backend = py::str(dist.attr("get_backend")(group));
  SEQPAR_ARG_CHECK(backend.find("gloo") != std::string::npos, "TorchComm: the group's backend is ",
                   backend,
                   "; seqpar computes on CPU tensors: use a gloo group "
                   "(torch.distributed.new_group(backend=\"gloo\"))");
  const int rank = dist.attr("get_rank")(group).cast<int>();
  SEQPAR_ARG_CHECK(rank >= 0, "TorchComm: this process (global rank ",
                   dist.attr("get_rank")().cast<int>(), ") is not a member of the group");
  std::vector<int> members = dist.attr("get_process_group_ranks")(group).cast<std::vector<int>>();
  PyRef store;
  try {
    store = PyRef(dist.attr("distributed_c10d").attr("_get_default_store")());
  } catch (const py::error_already_set&) {
    // No store to tell the others through: abort() then only fails this rank.
  }
  // One key per world: the same on every member (every member makes its worlds over this group
  // in the same order), distinct across torchrun's restarts.
  static std::map<std::vector<int>, int> worlds;
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  std::string key = concat("seqpar/abort/", restart ? restart : "0", "/", worlds[members]++, "/");
  for (size_t i = 0; i < members.size(); ++i) key += concat(i ? "." : "", members[i]);
  auto world = std::make_shared<TorchWorld>(std::move(store), std::move(key), rank);
  return std::make_unique<TorchCommunicator>(PyRef(std::move(group)), std::move(members), rank,
                                             std::move(world), true,
                                             Communicator::default_timeout());
}

}  // namespace seqpar::python
