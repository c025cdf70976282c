// The executor's worker thread: its scheduling policy (Options::batchWorker, TUNEDIST_WORKER_SCHED) as seen from an
// operation that runs on it, and the environment override with its error.
#include "catch_torch.h"

#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "backend/executor.h"
#include "scoped_env.h"

namespace {

using tunedist::test::ScopedEnv;

constexpr std::chrono::milliseconds kTimeout{60000};

// The scheduling policy of the worker thread of an executor with `options`, as an asynchronous operation on it sees
// it. The caller polls isCompleted() instead of calling wait(), which could run the operation itself (helpUntil).
int workerPolicy(tunedist::Executor::Options options) {
  auto executor = tunedist::Executor::start(0, options, [](const tunedist::shm::OpContext&) {});
  std::atomic<int> policy{-1};
  auto work = executor->launch(c10d::OpType::BARRIER, "tuned:barrier", {}, {}, true, kTimeout, 0,
                               [&policy](const tunedist::shm::OpContext&) { policy = sched_getscheduler(0); });
  while (!work->isCompleted()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  work->wait();
  executor->shutdown();
  return policy.load();
}

}  // namespace

TEST_CASE("executor: the worker runs queued operations under SCHED_BATCH by default", "[backend][executor]") {
  const int caller = sched_getscheduler(0);
  REQUIRE(caller == SCHED_OTHER);
  tunedist::Executor::Options batch;
  CHECK(batch.batchWorker);
  CHECK(workerPolicy(batch) == SCHED_BATCH);
  // The caller's own thread is untouched.
  CHECK(sched_getscheduler(0) == SCHED_OTHER);
}

TEST_CASE("executor: TUNEDIST_WORKER_SCHED chooses the worker's policy and rejects anything else",
          "[backend][executor]") {
  {
    ScopedEnv env("TUNEDIST_WORKER_SCHED", "normal");
    auto options = tunedist::Executor::Options::fromEnv();
    CHECK_FALSE(options.batchWorker);
    CHECK(workerPolicy(options) == SCHED_OTHER);
  }
  {
    ScopedEnv env("TUNEDIST_WORKER_SCHED", "batch");
    CHECK(tunedist::Executor::Options::fromEnv().batchWorker);
  }
  {
    ScopedEnv env("TUNEDIST_WORKER_SCHED", "fifo");
    CHECK_THROWS_WITH(tunedist::Executor::Options::fromEnv(), Catch::Contains("TUNEDIST_WORKER_SCHED") &&
                                                                  Catch::Contains("batch or normal") &&
                                                                  Catch::Contains("fifo"));
  }
}
