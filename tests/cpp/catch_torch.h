// Catch2 for the tests that include torch headers. c10's logging (c10/util/logging_is_not_google_glog.h) defines a
// glog-style CHECK that aborts on failure and is not counted; whichever header comes last wins, so a test that
// includes ATen after Catch2 silently gets c10's CHECK. Include c10's logging first, drop its CHECK, then Catch2:
// c10's header is include-guarded, so later torch includes do not bring its CHECK back.
#pragma once

#include <c10/util/Logging.h>

#undef CHECK

#include <catch2/catch.hpp>

#include <c10/util/Exception.h>

#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace tunedist_test {

// The message of the error `call` throws (c10's without its backtrace). Throws if `call` throws none, which fails
// the test case (and is safe on a rank's thread, where Catch2's assertion macros are not).
inline std::string errorOf(const std::function<void()>& call) {
  try {
    call();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {  // the engine's own errors (a failed group)
    return e.what();
  }
  throw std::runtime_error("expected an error, got none");
}

// Runs body(i) on `threads` threads (ranks of one process) and reports every thread's failure, "<who> i: ..." (c10's
// message without its backtrace), from the test's thread once all ended: Catch2's assertion macros are not
// thread-safe, so the threads only throw.
inline void runThreads(int threads, const std::function<void(int)>& body, const std::string& who = "thread") {
  std::mutex mutex;
  std::vector<std::string> failures;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::string message;
      try {
        body(t);
        return;
      } catch (const c10::Error& e) {
        message = e.what_without_backtrace();
      } catch (const std::exception& e) {
        message = e.what();
      }
      std::lock_guard<std::mutex> lock(mutex);
      failures.push_back(who + " " + std::to_string(t) + ": " + message);
    });
  }
  for (auto& t : pool) {
    t.join();
  }
  for (const auto& f : failures) {
    FAIL_CHECK(f);
  }
  CHECK(failures.empty());
}

}  // namespace tunedist_test
