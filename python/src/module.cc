// seqpar._core: the C++ side of the Python module seqpar (python/seqpar/__init__.py is the
// public face). Tensors cross this boundary as (address, shape, dtype) of contiguous memory the
// Python side owns and keeps alive for the call, so no input is copied; fp32 results come back
// as NumPy arrays that own seqpar's buffers, bf16/fp16 results are converted into tensors the
// Python side allocated. Every call into the library releases the GIL.
//
// Thread-safety: a Comm belongs to its rank (one Python thread under ThreadWorld, the main thread
// under MPI and torchrun), like the Communicator it wraps.
#include <cxxabi.h>
#include <omp.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gil.h"
#include "seqpar/comm/mpi.h"
#include "seqpar/comm/threads.h"
#include "seqpar/core/limits.h"
#include "seqpar/core/param_error.h"
#include "seqpar/core/timer.h"
#include "seqpar/parallel/cp_attention.h"
#include "seqpar/parallel/decode.h"
#include "seqpar/parallel/mesh.h"
#include "seqpar/parallel/partition.h"
#include "seqpar/parallel/strategies.h"
#include "seqpar/parallel/strategy_table.h"
#include "seqpar/plan/hardware.h"
#include "seqpar/plan/selection.h"
#include "seqpar/version.h"

namespace py = pybind11;

namespace seqpar::python {
// seqpar.plan's part of the module (plan.cc: plan/ and parallel/ both name a type Mesh).
void bind_plan(py::module_& m);
// The models (models.cc).
void bind_models(py::module_& m);
// The communicator over a torch.distributed process group (torch_comm.cc).
std::unique_ptr<Communicator> torch_communicator(py::object group);
}  // namespace seqpar::python

namespace seqpar::python {
namespace {

// What one attention call did on this rank: CommStats and CpStats of the call, as `seqpar run`
// reports them per rank.
struct CallStats {
  uint64_t bytes_sent = 0, bytes_recv = 0;
  std::vector<std::pair<std::string, std::array<uint64_t, 2>>> by_op;  // op -> (sent, recv)
  double seconds = 0;          // wall time of the call on this rank
  double compute_seconds = 0;  // inside the local kernel and merges
  double wait_seconds = 0;     // blocked on communication
  double end_sync_seconds = 0;
  int64_t peak_kv_bytes = 0, measured_kv_bytes = 0, work = 0, fallback_rows = 0;
  // Addresses of q, k, v as the strategy read them: the caller's memory when nothing was copied.
  std::array<uintptr_t, 3> input_addresses{};

  // Communication wait during the steps / call time (end-of-call sync excluded), as
  // exposed_comm_fraction of `seqpar run --json`.
  double exposed_comm_fraction() const {
    return seconds > 0 ? (wait_seconds - end_sync_seconds) / seconds : 0;
  }
};

// A rank's communicator as Python sees it. Under ThreadWorld it borrows the rank's communicator
// for the duration of run() and is invalidated after; MpiComm and TorchComm own theirs.
class Comm {
 public:
  explicit Comm(Communicator* borrowed) : comm_(borrowed) {}
  explicit Comm(std::unique_ptr<Communicator> owned) : owned_(std::move(owned)), comm_(owned_.get()) {}

  Communicator& get() {
    if (comm_ == nullptr)
      throw Error("this communicator is closed: a ThreadWorld rank's comm is valid only inside run()");
    return *comm_;
  }
  // The communicators of a strategy with this Ulysses degree (0 = all ranks), split once and
  // kept: splitting is collective, so every rank asks for the same degrees in the same order.
  SpComms& sp_comms(int ulysses_degree) {
    Communicator& c = get();
    const int u = ulysses_degree == 0 ? c.size() : ulysses_degree;
    if (!sp_ || sp_->ulysses_degree() != u) {
      sp_.reset();
      sp_ = std::make_unique<SpComms>(c, u);
    }
    return *sp_;
  }
  void close() {
    sp_.reset();
    comm_ = nullptr;
    owned_.reset();
  }
  CallStats last;
  std::string last_strategy;  // candidate_label of what the last call ran ("ring", "passq_ring")
  std::string last_choice;    // strategy "auto": the choice and its reason; else empty

 private:
  std::unique_ptr<Communicator> owned_;
  Communicator* comm_;
  std::unique_ptr<SpComms> sp_;
};

// A tensor of the caller's, by address: its shape and strides (elements; empty: row-major).
struct Buffer {
  uintptr_t address = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
};

// Memory of seqpar's (a result Tensor, a list of positions) that Python reads through the buffer
// protocol: np.asarray(buffer) is a view that keeps it alive, with no copy. The buffer protocol,
// unlike pybind11's NumPy API, does not depend on the NumPy version.
struct HostBuffer {
  std::shared_ptr<void> owner;
  void* data = nullptr;
  std::vector<py::ssize_t> shape;
  py::ssize_t itemsize = 4;
  std::string format;  // struct-module code: "f" (fp32), "q" (int64)

  py::buffer_info info() const {
    std::vector<py::ssize_t> strides(shape.size());
    py::ssize_t stride = itemsize;
    for (size_t i = shape.size(); i-- > 0;) {
      strides[i] = stride;
      stride *= shape[i];
    }
    return py::buffer_info(data, itemsize, format, static_cast<py::ssize_t>(shape.size()), shape,
                           strides);
  }
};

// An fp32 tensor of seqpar's handed to Python without a copy.
HostBuffer to_host(Tensor&& t) {
  auto owner = std::make_shared<Tensor>(std::move(t));
  HostBuffer b;
  b.data = owner->raw();
  b.shape.assign(owner->shape().begin(), owner->shape().end());
  b.format = py::format_descriptor<float>::format();
  b.owner = std::move(owner);
  return b;
}

// A caller's tensor as a view of its memory (strides as it gave them).
TensorView view_of(const Buffer& b, DType dtype) {
  return TensorView::strided(reinterpret_cast<const void*>(b.address), b.shape, b.strides, dtype);
}

int64_t options_hash(const std::string& s) {
  return static_cast<int64_t>(std::hash<std::string>{}(s) & 0x7fffffffffffffff);
}

// "3000,17,9000": the documents in the options' hash.
std::string seq_lens_text(const std::vector<int64_t>& seq_lens) {
  std::string s;
  for (int64_t l : seq_lens) s += detail::concat(s.empty() ? "" : ",", l);
  return s;
}

void record(Comm& c, const CommStats& s, const CpStats& cps, double seconds) {
  CallStats& st = c.last;
  st = CallStats{};
  st.bytes_sent = s.total_sent();
  st.bytes_recv = s.total_recv();
  for (size_t i = 0; i < static_cast<size_t>(OpKind::kCount); ++i)
    if (s.ops[i] > 0)
      st.by_op.push_back({std::string(op_kind_name(static_cast<OpKind>(i))),
                          {s.bytes_sent[i], s.bytes_recv[i]}});
  st.seconds = seconds;
  st.compute_seconds = cps.compute_seconds;
  st.wait_seconds = cps.wait_seconds;
  st.end_sync_seconds = cps.end_sync_seconds;
  st.peak_kv_bytes = cps.peak_kv_bytes;
  st.measured_kv_bytes = cps.measured_kv_bytes;
  st.work = cps.work;
  st.fallback_rows = cps.fallback_rows;
  for (size_t i = 0; i < 3; ++i)
    st.input_addresses[i] = reinterpret_cast<uintptr_t>(cps.input_addresses[i]);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += detail::concat(i ? ", " : "", shape[i]);
  return s + ")";
}

// One attention call's options, by the vocabulary's names (parallel/config.h): the Python side
// passes what the caller typed; the library parses, validates and reports in its own words.
struct AttentionArgs {
  std::string strategy = "ring";  // a strategy's name or alias, or "auto" (plan/selection.h)
  std::string layout = "contiguous", ulysses_mode = "uaa", softmax = "online", schedule = "default",
              dtype = "fp32", hardware = "cpu-ethernet";
  std::vector<int64_t> seq_lens;  // packed documents (varlen); empty: one sequence
  bool causal = false, pad = false;
  bool over_cache = false;  // decode_attention: new queries over a K/V cache
  int ulysses_degree = 0, ring_degree = 0, sequence_parallel_size = 0;  // 0: chosen
  int64_t text_tokens = 0, seq_len = 0;
  double scale = 0;
};

// Where every rank's tokens are, from what each rank holds. Over a sequence: the layout's own
// partition of the ranks' rows when their counts are the layout's, else (contiguous layout)
// contiguous runs of the given lengths; with seq_lens each document split on its own. Over a
// cache: the ranks' cache rows in rank order are the sequence, the ranks' queries in rank order
// its newest tokens. Also checks that the ranks agree on everything else (a mismatch would
// otherwise surface as a hang or a size error inside a collective).
Placement gather_placement(Communicator& comm, const AttentionArgs& a, Layout layout,
                           int64_t q_rows, int64_t kv_rows, std::array<int64_t, 6> agree) {
  const int n = comm.size();
  constexpr int kFields = 8;
  std::array<int64_t, kFields> row = {q_rows,   kv_rows,  agree[0], agree[1],
                                      agree[2], agree[3], agree[4], agree[5]};
  std::vector<int64_t> all(kFields * static_cast<size_t>(n));
  comm.all_gather(row.data(), sizeof(row), all.data());
  static const char* kNames[] = {"",         "",         "batch", "heads",
                                 "kv_heads", "head_dim", "dtype", "options"};
  for (int r = 0; r < n; ++r)
    for (int f = 2; f < kFields; ++f)
      SEQPAR_ARG_CHECK(all[kFields * r + f] == row[f], "rank ", r, " and rank ", comm.rank(),
                       " called with different ", kNames[f],
                       "; every rank passes the same shapes (but its own tokens) and options");
  Placement place;
  if (a.over_cache) {
    place.over_cache = true;
    place.cache.kv_pos.resize(n);
    place.cache.q_pos.resize(n);
    int64_t P = 0, T = 0;
    for (int r = 0; r < n; ++r) {
      T += all[kFields * r];
      P += all[kFields * r + 1];
    }
    SEQPAR_ARG_CHECK(T <= P, T, " queries but only ", P,
                     " cached tokens; the queries are the newest tokens of the cache");
    int64_t kp = 0, qp = P - T;
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < all[kFields * r + 1]; ++i) place.cache.kv_pos[r].push_back(kp++);
      for (int64_t i = 0; i < all[kFields * r]; ++i) place.cache.q_pos[r].push_back(qp++);
    }
    return place;
  }
  std::vector<int64_t> counts(n);
  int64_t seq = 0;
  for (int r = 0; r < n; ++r) {
    counts[r] = all[kFields * r];
    seq += counts[r];
    SEQPAR_ARG_CHECK(counts[r] >= 1, "rank ", r, " holds no tokens; every rank needs at least one");
  }
  if (!a.seq_lens.empty()) {
    int64_t sum = 0;
    for (int64_t l : a.seq_lens) sum += l;
    SEQPAR_ARG_CHECK(sum == seq, "seq_lens sum to ", sum, " but the ranks hold ", seq,
                     " tokens together; the documents must fill the sequence");
  }
  place.part = a.seq_lens.empty() || layout == Layout::kContiguous
                   ? Partition(seq, n, layout)
                   : Partition::documents(a.seq_lens, seq, n, layout);
  bool same = true;
  for (int r = 0; r < n; ++r) same = same && place.part.count(r) == counts[r];
  if (same) return place;
  SEQPAR_ARG_CHECK(
      layout == Layout::kContiguous, "the ranks hold ",
      [&] {
        std::string s;
        for (int r = 0; r < n; ++r) s += detail::concat(r ? ", " : "", counts[r]);
        return s;
      }(),
      " tokens, but layout ", layout_name(layout), " of ", seq, " tokens over ", n,
      " ranks gives rank ", comm.rank(), " ", place.part.count(comm.rank()),
      "; shard with seqpar.Partition(", seq, ", ", n, ", \"", layout_name(layout),
      "\") or use layout \"contiguous\" for uneven runs");
  place.part = Partition::from_counts(counts);
  return place;
}

// One attention call on this rank through the library's one entry point (cp_attention.h):
// q (B, Tq + T, H, D), k, v (B, Tkv + T, Hkv, D), the last T rows being joint attention's text
// tokens (text_tokens = T). Over a sequence Tq = Tkv, this rank's tokens; over a cache
// (decode_attention) Tq new queries over Tkv cached rows. Writes the output into `out` (q's shape,
// the input dtype, AttnShape::out_dtype) when out.address != 0, else returns it as an fp32 array;
// returns the lse
// (B, Tq + T, H) fp32.
py::tuple call_attention(Comm& c, const Buffer& q, const Buffer& k, const Buffer& v,
                         const Buffer& out, const AttentionArgs& a) {
  const DType dtype = parse_dtype(a.dtype);
  ParallelConfig config;
  const bool automatic = a.strategy == "auto";
  if (!automatic) config.strategy = parse_strategy(a.strategy);
  config.layout = parse_layout(a.layout);
  config.ulysses_mode = parse_ulysses_mode(a.ulysses_mode);
  config.softmax = parse_softmax_mode(a.softmax);
  config.schedule = parse_schedule_kind(a.schedule);
  config.pad = a.pad;
  const int64_t B = q.shape[0], rows = q.shape[1], H = q.shape[2], D = q.shape[3];
  const int64_t Hkv = k.shape[2], T = a.text_tokens, kv_rows = k.shape[1];
  SEQPAR_ARG_CHECK(T >= 0 && (T == 0 || (T < rows && T < kv_rows)), "text_tokens ", T,
                   " must be at least 0 and fewer than the ", rows, " rows of q");
  SEQPAR_ARG_CHECK(k.shape == v.shape, "k ", shape_text(k.shape), " and v ", shape_text(v.shape),
                   " must have one shape");
  SEQPAR_ARG_CHECK(a.pad == (a.seq_len > 0),
                   a.pad ? "pad=True needs seq_len, the number of real tokens (keys at "
                           "positions >= seq_len are masked)"
                         : "seq_len is for pad=True");

  Communicator& comm = c.get();
  const int n = comm.size();
  SEQPAR_ARG_CHECK(a.sequence_parallel_size == 0 || a.sequence_parallel_size == n,
                   "sequence_parallel_size ", a.sequence_parallel_size, " must equal the ", n,
                   " ranks of the communicator");
  config.mesh = {1, 1, a.ring_degree, a.ulysses_degree};
  const std::array<int64_t, 6> agree = {
      B,
      H,
      Hkv,
      D,
      static_cast<int64_t>(dtype),
      options_hash(detail::concat(a.strategy, '|', a.layout, '|', a.causal, '|', a.ulysses_mode,
                                  '|', a.softmax, '|', a.ulysses_degree, '|', a.ring_degree, '|',
                                  a.pad, '|', a.seq_len, '|', a.scale, '|', a.schedule, '|',
                                  a.hardware, '|', T, '|', seq_lens_text(a.seq_lens)))};
  struct Done {
    std::optional<Tensor> result;
    Tensor lse;
  };
  Done done = without_gil([&]() -> Done {
    const Placement place = gather_placement(comm, a, config.layout, rows - T, kv_rows - T, agree);
    AttnShape shape;
    shape.batch = B;
    shape.heads = H;
    shape.kv_heads = Hkv;
    shape.head_dim = D;
    shape.causal = a.causal;
    shape.dtype = dtype;
    shape.text_tokens = T;
    // Written into the caller's tensor in its dtype: the output comes back in it (Ulysses sends
    // it so); the lse is returned in fp32.
    if (out.address != 0) shape.out_dtype = dtype;
    if (place.over_cache) {
      shape.fresh = 0;
      for (const auto& qp : place.cache.q_pos) shape.fresh += static_cast<int64_t>(qp.size());
      for (const auto& kp : place.cache.kv_pos) shape.seq += static_cast<int64_t>(kp.size());
      shape.cached = shape.seq - shape.fresh;
    } else {
      shape.seq = a.pad ? a.seq_len : place.part.seq();
      SEQPAR_ARG_CHECK(shape.seq <= place.part.seq(), "seq_len ", a.seq_len, " exceeds the ",
                       place.part.seq(), " tokens of the ranks together");
      shape.seq_lens = a.seq_lens;
    }
    if (automatic) {
      const AttnChoice choice =
          choose_attention(config, n, shape, load_hardware_profile(a.hardware));
      config = choice.config;
      c.last_choice = candidate_label(config) + ": " + choice.reason;
    } else {
      fill_sp_degrees(config, n, H);
      c.last_choice.clear();
    }
    SpComms& comms = c.sp_comms(config.mesh.ulysses);

    // The caller's rows as views: this rank's tokens, then the text's (no copy; the entry point
    // packs a view that is not dense). Outputs written into the caller's tensor (or, fp32, into
    // the result handed back), the lse into one (B, rows, H) array.
    const int64_t q_rows = rows - T;
    const TensorView qv = view_of(q, dtype), kv = view_of(k, dtype), vv = view_of(v, dtype);
    AttnInputs in{qv.narrow(1, 0, q_rows), kv.narrow(1, 0, kv_rows - T),
                  vv.narrow(1, 0, kv_rows - T)};
    std::optional<Tensor> result;
    if (out.address == 0 && T > 0) result.emplace(std::vector<int64_t>{B, rows, H, D});
    const MutableTensorView out_all =
        out.address != 0 ? MutableTensorView::strided(reinterpret_cast<void*>(out.address),
                                                      out.shape, out.strides, dtype)
        : result         ? MutableTensorView(*result)
                         : MutableTensorView();
    Tensor lse = T > 0 ? Tensor({B, rows, H}) : Tensor();
    AttnOutputs res;
    if (out_all.ndim() > 0) res.out_into = out_all.narrow(1, 0, q_rows);
    if (T > 0) {
      in.text_q = qv.narrow(1, q_rows, T);
      in.text_k = kv.narrow(1, kv_rows - T, T);
      in.text_v = vv.narrow(1, kv_rows - T, T);
      res.text_out_into = out_all.narrow(1, q_rows, T);
      res.lse_into = MutableTensorView(lse).narrow(1, 0, q_rows);
      res.text_lse_into = MutableTensorView(lse).narrow(1, q_rows, T);
    }
    CpStats cps;
    comms.reset_stats();
    const double t0 = now_seconds();
    attention(config, shape, comms, place, in, res, &cps, {static_cast<float>(a.scale), 0, 0});
    record(c, comms.stats(), cps, now_seconds() - t0);
    c.last_strategy = candidate_label(config);
    if (T == 0) lse = std::move(res.lse);
    if (out.address == 0 && T == 0) result.emplace(std::move(res.out));
    return {std::move(result), std::move(lse)};
  });
  py::object o = done.result ? py::cast(to_host(std::move(*done.result))) : py::object(py::none());
  return py::make_tuple(o, to_host(std::move(done.lse)));
}

// A flag another thread sets to stop a ThreadWorld.run: read without the GIL (a thread that
// takes the GIL while the interpreter exits is ended where it stands).
struct StopFlag {
  std::atomic<bool> set{false};
};

// The ThreadWorld.run calls in progress, and whether the interpreter has begun to exit (its atexit
// callbacks run). A run in a daemon thread must end before CPython ends daemon threads, which it
// does wherever they next take the GIL: a rank thread ended there, inside ThreadWorld::run, takes
// the process down (std::terminate). At exit the runs are stopped as Ctrl-C stops them and
// waited for; later runs are refused. Never destroyed: rank threads may outlive static objects.
struct Runs {
  std::mutex mutex;
  std::condition_variable ended;
  int active = 0;  // guarded by mutex
  std::atomic<bool> exiting{false};
};
Runs& runs() {
  static Runs* const r = new Runs;
  return *r;
}

// One run counted from its start to its return into Python.
class CountedRun {
 public:
  CountedRun() {
    std::lock_guard<std::mutex> lock(runs().mutex);
    if (runs().exiting.load())
      throw std::runtime_error("ThreadWorld.run refused: the interpreter is exiting");
    ++runs().active;
  }
  ~CountedRun() {
    {
      std::lock_guard<std::mutex> lock(runs().mutex);
      --runs().active;
    }
    runs().ended.notify_all();
  }
  CountedRun(const CountedRun&) = delete;
  CountedRun& operator=(const CountedRun&) = delete;
};

// atexit: stop every run in progress and wait, without the GIL, until each has returned into
// Python (a rank inside a long kernel call finishes it first), at most `seconds`.
void stop_runs_at_exit(double seconds) {
  runs().exiting = true;
  without_gil([&] {
    std::unique_lock<std::mutex> lock(runs().mutex);
    runs().ended.wait_for(lock, std::chrono::duration<double>(seconds),
                          [] { return runs().active == 0; });
  });
}

// ThreadWorld(n).run(fn): fn(comm) on n threads, one per rank, each holding the GIL only while
// it runs Python; the results in rank order. A rank's exception (Python or seqpar) aborts the
// others' communication and is raised here. `stop` (None or a _StopFlag): once set, the ranks
// are stopped as Ctrl-C stops them, and RuntimeError "stopped" is raised.
py::list run_threads(int n, const py::function& fn, double timeout_s, int threads,
                     const py::object& stop) {
  StopFlag* const stop_flag = stop.is_none() ? nullptr : stop.cast<StopFlag*>();
  const CountedRun counted;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int per_rank = threads > 0 ? threads : std::max(1, cores / std::max(1, n));
  limits::check_threads(n, per_rank);  // the command line's bounds
  SEQPAR_ARG_CHECK(std::isfinite(timeout_s) && timeout_s >= 0 &&
                       (timeout_s == 0 || (timeout_s >= limits::kMinTimeoutSeconds &&
                                           timeout_s <= limits::kMaxTimeoutSeconds)),
                   "timeout ", timeout_s, " is out of range; valid: ", limits::kMinTimeoutSeconds,
                   " to ", limits::kMaxTimeoutSeconds, " seconds");
  const auto timeout = timeout_s > 0
                           ? std::chrono::milliseconds(std::llround(timeout_s * 1000))
                           : Communicator::default_timeout();
  std::vector<py::object> results(static_cast<size_t>(n));
  // A rank's Python exception stays a Python object, owned here and touched with the GIL only;
  // what crosses the rank threads is a RaisedInRank naming the rank.
  std::vector<py::object> raised(static_cast<size_t>(n));
  struct RaisedInRank : Error {
    int rank;
    RaisedInRank(int r, const std::string& what) : Error(what), rank(r) {}
  };
  // Ctrl-C reaches Python on the main thread only: there the ranks are stopped when it does.
  const py::module_ threading = py::module_::import("threading");
  const bool main_thread = threading.attr("current_thread")().is(threading.attr("main_thread")());
  const std::function<bool()> interrupted = [&] {
    if (runs().exiting.load()) return true;
    if (stop_flag != nullptr && stop_flag->set.load()) return true;
    if (!main_thread) return false;
    py::gil_scoped_acquire gil;
    return PyErr_CheckSignals() != 0;  // the KeyboardInterrupt stays pending for the caller
  };
  try {
    without_gil([&] {
      ThreadWorld::run(
          n,
          [&](Communicator& comm) {
            omp_set_num_threads(per_rank);
            py::gil_scoped_acquire acquire;
            // Leaving with the GIL held while the interpreter exits: its thread state must not
            // be released (CPython is tearing the states down); the exit ends the thread.
            struct KeepStateAtExit {
              py::gil_scoped_acquire& gil;
              ~KeepStateAtExit() {
                if (interpreter_exiting()) gil.disarm();
              }
            } keep{acquire};
            auto handle = std::make_shared<Comm>(&comm);
            struct Closer {  // the comm dies with the rank, even if fn keeps it
              std::shared_ptr<Comm> c;
              ~Closer() { c->close(); }
            } closer{handle};
            try {
              results[comm.rank()] = fn(handle);
            } catch (abi::__forced_unwind&) {
              // The interpreter is exiting and ends this thread where it waits for the GIL: the
              // thread holds no GIL and no thread state may be released for it.
              acquire.disarm();
              throw;
            } catch (py::error_already_set& e) {
              raised[comm.rank()] = e.value();
              throw RaisedInRank(comm.rank(), e.what());
            }
          },
          timeout, interrupted);
    });
  } catch (const Interrupted&) {
    if (PyErr_Occurred()) throw py::error_already_set();  // the pending KeyboardInterrupt
    if (runs().exiting.load()) throw std::runtime_error("stopped: the interpreter is exiting");
    throw std::runtime_error("stopped: the caller set the ranks' stop event");
  } catch (const RaisedInRank& e) {
    const py::object& value = raised[e.rank];
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(value.ptr())), value.ptr());
    throw py::error_already_set();
  }
  py::list out;
  for (auto& r : results) out.append(r);
  return out;
}

// An environment variable holding a positive integer, else 0.
int64_t env_count(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return 0;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  return end != v && *end == '\0' && n >= 1 ? n : 0;
}

// Refuses an MPI world smaller than the one the environment announces: torchrun (and
// torch.distributed's env://) set WORLD_SIZE (LOCAL_WORLD_SIZE on one node), and a process it
// starts is a world of 1 to MPI, so each rank would attend to its own shard only.
void check_mpi_world(int64_t mpi_size) {
  const char* var = env_count("WORLD_SIZE") > 0 ? "WORLD_SIZE" : "LOCAL_WORLD_SIZE";
  const int64_t announced = env_count(var);
  const bool torchrun = std::getenv("TORCHELASTIC_RUN_ID") != nullptr;
  SEQPAR_ARG_CHECK(announced <= mpi_size, "MpiComm: ", torchrun ? "torchrun" : "the environment",
                   " announces a world of ", announced, " processes (", var, "=", announced,
                   ") but MPI's world has ", mpi_size,
                   "; use seqpar.TorchComm() (torch.distributed) or launch with mpirun -np ",
                   announced);
}

std::shared_ptr<Comm> mpi_comm(py::object mpi4py_comm) {
  SEQPAR_ARG_CHECK(mpi_available(), "MpiComm: this build of seqpar has no MPI; use ThreadWorld");
  // Without an MPI launcher, MPI starts each process as a world of its own.
  if (!mpi_launched()) check_mpi_world(1);
  py::module_ MPI = py::module_::import("mpi4py.MPI");
  check_mpi_world(MPI.attr("COMM_WORLD").attr("Get_size")().cast<int64_t>());
  if (mpi4py_comm.is_none()) mpi4py_comm = MPI.attr("COMM_WORLD");
  const auto handle = MPI.attr("_handleof")(mpi4py_comm).cast<uintptr_t>();
  mpi_init(nullptr, nullptr);  // adopts mpi4py's MPI
  std::unique_ptr<Communicator> comm = without_gil([&] { return mpi_communicator(handle); });
  return std::make_shared<Comm>(std::move(comm));
}

py::dict stats_dict(const CallStats& s) {
  py::dict by_op;
  for (const auto& [name, sr] : s.by_op) by_op[py::str(name)] = py::make_tuple(sr[0], sr[1]);
  py::dict d;
  d["bytes_sent"] = s.bytes_sent;
  d["bytes_recv"] = s.bytes_recv;
  d["bytes_by_op"] = by_op;
  d["seconds"] = s.seconds;
  d["compute_seconds"] = s.compute_seconds;
  d["wait_seconds"] = s.wait_seconds;
  d["end_sync_seconds"] = s.end_sync_seconds;
  d["exposed_comm_fraction"] = s.exposed_comm_fraction();
  d["peak_kv_bytes"] = s.peak_kv_bytes;
  d["measured_kv_bytes"] = s.measured_kv_bytes;
  d["work"] = s.work;
  d["fallback_rows"] = s.fallback_rows;
  d["input_addresses"] = py::make_tuple(s.input_addresses[0], s.input_addresses[1],
                                        s.input_addresses[2]);
  return d;
}

}  // namespace

Communicator& communicator_of(py::handle comm) { return comm.cast<Comm&>().get(); }

}  // namespace seqpar::python

PYBIND11_MODULE(_core, m) {
  using namespace seqpar;
  using namespace seqpar::python;
  m.doc() = "seqpar's C++ core; use the package seqpar, not this module";

  // Exceptions: bad arguments are ValueError with the library's one-line message; communication
  // failures CommError (a RuntimeError), deadlines CommTimeout (also a TimeoutError).
  static py::exception<CommError> comm_error(m, "CommError", PyExc_RuntimeError);
  static py::handle comm_timeout = [&] {
    py::object bases = py::make_tuple(comm_error, py::handle(PyExc_TimeoutError));
    py::object cls = py::reinterpret_steal<py::object>(
        PyErr_NewException("seqpar._core.CommTimeout", bases.ptr(), nullptr));
    m.attr("CommTimeout") = cls;
    return cls.release();
  }();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ParamError& e) {  // each parameter it names as the keyword
      PyErr_SetString(PyExc_ValueError, e.spelled([](std::string_view name) {
                                           return front_end_name(name, FrontEnd::kPython);
                                         }).c_str());
    } catch (const InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const CommTimeout& e) {
      PyErr_SetString(comm_timeout.ptr(), e.what());
    } catch (const CommError& e) {
      PyErr_SetString(comm_error.ptr(), e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  py::class_<HostBuffer>(m, "_HostBuffer", py::buffer_protocol())
      .def_buffer([](HostBuffer& b) { return b.info(); });

  py::class_<Buffer>(m, "_Buffer")
      .def(py::init([](uintptr_t address, std::vector<int64_t> shape,
                       std::vector<int64_t> strides) {
             return Buffer{address, std::move(shape), std::move(strides)};
           }),
           py::arg("address"), py::arg("shape"), py::arg("strides") = std::vector<int64_t>{});

  py::class_<AttentionArgs>(m, "_AttentionArgs")
      .def(py::init<>())
      .def_readwrite("strategy", &AttentionArgs::strategy)
      .def_readwrite("layout", &AttentionArgs::layout)
      .def_readwrite("ulysses_mode", &AttentionArgs::ulysses_mode)
      .def_readwrite("softmax", &AttentionArgs::softmax)
      .def_readwrite("schedule", &AttentionArgs::schedule)
      .def_readwrite("seq_lens", &AttentionArgs::seq_lens)
      .def_readwrite("dtype", &AttentionArgs::dtype)
      .def_readwrite("causal", &AttentionArgs::causal)
      .def_readwrite("pad", &AttentionArgs::pad)
      .def_readwrite("ulysses_degree", &AttentionArgs::ulysses_degree)
      .def_readwrite("ring_degree", &AttentionArgs::ring_degree)
      .def_readwrite("text_tokens", &AttentionArgs::text_tokens)
      .def_readwrite("seq_len", &AttentionArgs::seq_len)
      .def_readwrite("scale", &AttentionArgs::scale)
      .def_readwrite("hardware", &AttentionArgs::hardware)
      .def_readwrite("over_cache", &AttentionArgs::over_cache)
      .def_readwrite("sequence_parallel_size", &AttentionArgs::sequence_parallel_size);

  py::class_<Comm, std::shared_ptr<Comm>>(
      m, "Comm",
      "A rank's communicator: ThreadWorld.run hands one to each rank, MpiComm and TorchComm make "
      "one. Use it from its rank's thread only.")
      .def_property_readonly(
          "rank", [](Comm& c) { return c.get().rank(); }, "This rank, 0 to size - 1.")
      .def_property_readonly(
          "size", [](Comm& c) { return c.get().size(); }, "The number of ranks.")
      .def_property_readonly(
          "backend", [](Comm& c) { return c.get().backend(); },
          "\"threads\", \"mpi\" or \"torch\" (torch.distributed).")
      .def(
          "barrier",
          [](Comm& c) {
            Communicator& comm = c.get();
            without_gil([&] { comm.barrier(); });
          },
          "Waits until every rank has called barrier() (bounded by the deadline).")
      .def(
          "abort",
          [](Comm& c, const std::string& message) {
            Communicator& comm = c.get();
            without_gil([&] { comm.abort(message); });
          },
          py::arg("message"),
          "Reports this rank's failure to every rank (best effort, never raises): their pending "
          "and later communication raises CommError \"rank R failed: message\".")
      .def("_last_stats", [](Comm& c) { return stats_dict(c.last); })
      .def_property_readonly(
          "last_strategy",
          [](Comm& c) -> py::object {
            return c.last_strategy.empty() ? py::object(py::none()) : py::str(c.last_strategy);
          },
          "What this rank's last call ran: \"ring\", \"ring_steal\", \"usp_u2_r2\", "
          "\"passkv\", \"passq\", \"passq_ring\", ...")
      .def_property_readonly(
          "last_pass",
          [](Comm& c) -> py::object {
            const std::string& s = c.last_strategy;
            if (s == "passkv") return py::str("kv");
            if (s == "passq") return py::str("q");
            if (s == "passq_ring") return py::str("q-ring");
            return py::none();
          },
          "decode_attention: \"q\", \"q-ring\" or \"kv\", the pass of this rank's last call")
      .def_property_readonly(
          "last_choice",
          [](Comm& c) -> py::object {
            return c.last_choice.empty() ? py::object(py::none()) : py::str(c.last_choice);
          },
          "strategy \"auto\": what it chose and why (the planner's replayed schedules)")
      .def("_set_timeout",
           [](Comm& c, double s) {
             limits::check_range("timeout", s, limits::kMinTimeoutSeconds,
                                 limits::kMaxTimeoutSeconds);
             c.get().set_timeout(std::chrono::milliseconds(std::llround(s * 1000)));
           })
      .def("close", &Comm::close,
           "Releases the communicator (an MpiComm's MPI duplicates); later use raises.");

  m.def("_attention", &call_attention);
  py::class_<StopFlag, std::shared_ptr<StopFlag>>(m, "_StopFlag")
      .def(py::init<>())
      .def("set", [](StopFlag& f) { f.set = true; })
      .def("is_set", [](const StopFlag& f) { return f.set.load(); });
  m.def("_run_threads", &run_threads, py::arg("n"), py::arg("fn"), py::arg("timeout"),
        py::arg("threads"), py::arg("stop") = py::none());
  m.def("_stop_runs_at_exit", &stop_runs_at_exit, py::arg("seconds"));
  m.def("_check_threads", [](int64_t ranks, int64_t threads) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    limits::check_threads(
        ranks, threads > 0 ? threads : std::max<int64_t>(1, cores / std::max<int64_t>(1, ranks)));
  });
  m.def("_mpi_comm", &mpi_comm);
  m.def("_torch_comm", [](py::object group) {
    return std::make_shared<Comm>(torch_communicator(std::move(group)));
  });

  m.def("_partition_positions", [](int64_t seq, int ranks, const std::string& layout,
                                   const std::vector<int64_t>& seq_lens) {
    const Layout l = parse_layout(layout);
    limits::check_range("seq", seq, 1, limits::kMaxTokens);
    limits::check_range("ranks", int64_t{ranks}, 1, limits::kMaxRanks);
    // The positions three times over at the peak: the partition's, the per-rank copies handed
    // to NumPy, and the layout's work lists.
    limits::check_fits_memory(detail::concat("Partition of ", seq, " tokens (their positions)"),
                              24.0 * static_cast<double>(seq));
    if (!seq_lens.empty()) {  // every layout takes only lengths that tile the sequence
      const int64_t total = cu_seqlens(seq_lens).back();
      SEQPAR_ARG_CHECK(total <= seq, "seq_lens sum to ", total, ", more than seq ", seq,
                       "; expected at most seq (the rest is padding)");
    }
    const Partition part = seq_lens.empty() || l == Layout::kContiguous
                               ? Partition(seq, ranks, l)
                               : Partition::documents(seq_lens, seq, ranks, l);
    py::list out;
    for (int r = 0; r < ranks; ++r) {
      auto positions = std::make_shared<std::vector<int64_t>>(part.positions(r).begin(),
                                                             part.positions(r).end());
      HostBuffer b;
      b.data = positions->data();
      b.shape = {static_cast<py::ssize_t>(positions->size())};
      b.itemsize = sizeof(int64_t);
      b.format = py::format_descriptor<int64_t>::format();
      b.owner = std::move(positions);
      out.append(b);
    }
    return out;
  });
  m.def("_mesh_rows_json", [](int cfg, int tp, int ring, int ulysses, int ranks, int64_t heads,
                              int64_t seq) {
    const Mesh mesh(MeshShape{.cfg = cfg, .tp = tp, .ring = ring, .ulysses = ulysses}, ranks);
    mesh.check(heads, seq);
    return mesh_rows_json(mesh, heads, seq);
  });
  bind_plan(m);
  bind_models(m);
  m.def("version", [] { return std::string(version()); });
}
