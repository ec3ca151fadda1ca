// The GIL released around the library's work, safely at interpreter exit.
//
// pybind11's gil_scoped_release re-takes the GIL in its destructor. When the interpreter is
// exiting, CPython ends a thread that asks for the GIL with pthread_exit, whose forced unwinding
// cannot pass through a destructor (std::terminate: "terminate called without an active
// exception"), and a thread that waits for the GIL while the interpreter begins to exit is ended
// that way. without_gil(fn) therefore re-takes the GIL in ordinary code: fn's exception is held
// while the GIL is taken and rethrown after, and a pthread_exit there unwinds the thread cleanly.
// Thread-safety: called by the thread that holds the GIL.
#pragma once

#include <Python.h>
#include <cxxabi.h>

#include <exception>
#include <optional>
#include <type_traits>
#include <utility>

namespace seqpar::python {

// True once the interpreter has begun to exit (ask it with the GIL held: it cannot change then).
inline bool interpreter_exiting() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// fn() without the GIL; its result, or its exception rethrown once the GIL is held again.
template <typename Fn>
auto without_gil(Fn&& fn) -> decltype(fn()) {
  using R = decltype(fn());
  PyThreadState* state = PyEval_SaveThread();
  std::exception_ptr error;
  std::conditional_t<std::is_void_v<R>, bool, std::optional<R>> result{};
  try {
    if constexpr (std::is_void_v<R>)
      fn();
    else
      result.emplace(fn());
  } catch (abi::__forced_unwind&) {
    throw;  // the thread is being ended; no GIL to take
  } catch (...) {
    error = std::current_exception();
  }
  PyEval_RestoreThread(state);  // not in a destructor: see above
  if (error) std::rethrow_exception(error);
  if constexpr (!std::is_void_v<R>) return std::move(*result);
}

}  // namespace seqpar::python
