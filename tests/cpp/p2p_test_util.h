// Helpers of the point-to-point engine tests (test_shm_p2p*.cpp): ranks as threads, each with its own P2pEngine,
// over shm_test_util.h's in-memory rendezvous; blocking send/recv built on the engine's callbacks; a barrier.
#pragma once

#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>

#include "shm/p2p/engine.h"
#include "shm_test_util.h"

namespace tunedist::test {

using shm::p2p::P2pEngine;

// Small rings, so messages of a few KiB already stream through in pieces.
inline ShmOptions p2pOptions(size_t ringBytes = 4096) {
  ShmOptions o;
  o.p2pChannelBytes = ringBytes;
  return o;
}

// Quick liveness: a stopped heartbeat is noticed within a few hundred ms.
inline ShmOptions p2pFastDeathOptions() {
  ShmOptions o = p2pOptions();
  o.heartbeatPeriod = Ms(10);
  o.deadAfter = Ms(150);
  return o;
}

// What one operation's Done reported.
struct Outcome {
  std::exception_ptr error;
  int rank = -2;
};

// One operation's completion: done() is the callback to give the engine, get() waits for it on the test thread.
class Waiter {
 public:
  P2pEngine::Done done() {
    auto promise = promise_;
    // The error moves on, so its last reference is never dropped on the engine's thread (libstdc++'s refcount is
    // invisible to ThreadSanitizer, which would report the free as a race).
    return [promise](std::exception_ptr error, int rank) { promise->set_value(Outcome{std::move(error), rank}); };
  }
  Outcome get(Ms timeout = kOpTimeout) {
    if (future_.wait_for(timeout) != std::future_status::ready) {
      failCheck("an operation did not complete within ", timeout.count(), " ms");
    }
    return future_.get();
  }

 private:
  std::shared_ptr<std::promise<Outcome>> promise_ = std::make_shared<std::promise<Outcome>>();
  std::future<Outcome> future_ = promise_->get_future();
};

inline Outcome sendWait(P2pEngine& e, int dst, int tag, const void* data, size_t bytes, Ms timeout = kOpTimeout) {
  Waiter w;
  e.isend(dst, tag, data, bytes, Clock::now() + timeout, w.done());
  return w.get(timeout + Ms(10000));
}

inline Outcome recvWait(P2pEngine& e, int src, int tag, void* data, size_t bytes, Ms timeout = kOpTimeout) {
  Waiter w;
  e.irecv(src, tag, data, bytes, Clock::now() + timeout, w.done());
  return w.get(timeout + Ms(10000));
}

// Throws (naming `what`) unless the operation succeeded; returns the rank it reported.
inline int expectOk(const Outcome& o, const std::string& what) {
  if (o.error) {
    failCheck(what, " failed: ", messageOf(o.error));
  }
  return o.rank;
}

// Throws unless the operation failed with an E whose message contains every one of `parts`; returns the message.
template <typename E>
std::string expectError(const Outcome& o, const std::string& what, std::initializer_list<std::string> parts) {
  if (!o.error) {
    failCheck(what, " succeeded but should have failed");
  }
  try {
    std::rethrow_exception(o.error);
  } catch (const E& e) {
    std::string msg = e.what();
    for (const std::string& p : parts) {
      if (msg.find(p) == std::string::npos) {
        failCheck(what, ": the error does not mention '", p, "': ", msg);
      }
    }
    return msg;
  } catch (const std::exception& e) {
    failCheck(what, ": failed with the wrong error type: ", e.what());
  }
}

// A reusable barrier for the rank threads of one test.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    int gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, kOpTimeout, [&] { return gen != generation_; })) {
      failCheck("barrier timed out");
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  const int n_;
  int arrived_ = 0;
  int generation_ = 0;
};

// Runs body(engine, rank) for `size` ranks, one thread and one engine each. A rank that throws aborts its engine,
// so peers waiting on it fail fast; every failure is rethrown on the calling thread, naming its rank.
inline void runP2p(int size, const ShmOptions& options, const std::function<void(P2pEngine&, int)>& body) {
  auto rendezvous = std::make_shared<MemRendezvous>();
  rethrowFailures(spawn(size, [&](int r) {
    P2pEngine engine(rendezvous, r, size, options);
    try {
      body(engine, r);
    } catch (const std::exception& e) {
      engine.abort(core::detail::str("test rank ", r, " failed: ", e.what()));
      throw;
    }
  }));
}

}  // namespace tunedist::test
