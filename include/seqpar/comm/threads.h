// threads backend: N ranks as threads of one process, sharing one ThreadWorld. No launcher.
// A receiver copies straight from the sender's buffer (rendezvous), collectives read peers'
// buffers in place: no staging copies.
// Thread-safety: ThreadWorld is shared by all rank threads (internally synchronized); each
// Communicator it hands out belongs to one rank thread.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "seqpar/comm/communicator.h"

namespace seqpar {

class ThreadWorldState;  // opaque, src/comm/threads/

class ThreadWorld {
 public:
  explicit ThreadWorld(int size,
                       std::chrono::milliseconds timeout = Communicator::default_timeout());
  ~ThreadWorld();
  int size() const;
  // The world communicator of rank r (call once per rank).
  std::unique_ptr<Communicator> communicator(int rank);

  // Runs fn(comm) on `size` threads, one per rank. If any rank throws, the others' communication
  // fails fast (abort), all threads are joined, and the first exception (by time) is rethrown
  // here; errors on other ranks that only report that abort are not rethrown.
  // If a rank's thread cannot be started (the process or user is out of threads), the world is
  // aborted, the threads already started are joined, and seqpar::Error names the rank and the
  // cause; the process does not terminate.
  static void run(int size, const std::function<void(Communicator&)>& fn,
                  std::chrono::milliseconds timeout = Communicator::default_timeout());
  // The same, asking `interrupted` every 100 ms while the ranks run (on the calling thread).
  // When it says true, every rank's communication fails at once (its pending and next waits:
  // "rank -1 failed: interrupted"), the threads are joined, and Interrupted is thrown; a rank
  // inside a long computation stops at its next communication.
  static void run(int size, const std::function<void(Communicator&)>& fn,
                  std::chrono::milliseconds timeout, const std::function<bool()>& interrupted);

  // Test hook: called with each rank before its thread starts; a throw stands for a failed
  // thread start. Empty by default; set it before run() from one thread.
  static std::function<void(int rank)>& thread_start_hook();

 private:
  std::shared_ptr<ThreadWorldState> state_;
};

}  // namespace seqpar
