// The executor's worker thread: its scheduling policy (Options::batchWorker, TUNEDIST_WORKER_SCHED) as seen from an
// operation that runs on it, and the environment override with its error; which synchronous calls return no Work
// (Options::syncReturnsWork, TUNEDIST_SYNC_WORK).
#include "catch_torch.h"

#include <ATen/record_function.h>
#include <sched.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "backend/cpu/executor.h"
#include "scoped_env.h"

namespace {

using tunedist::test::ScopedEnv;

constexpr std::chrono::milliseconds kTimeout{60000};

// The scheduling policy of the worker thread of an executor with `options`, as an asynchronous operation on it sees
// it. The caller polls isCompleted() instead of calling wait(), which could run the operation itself (helpUntil).
int workerPolicy(tunedist::cpu::Executor::Options options) {
  auto executor = tunedist::cpu::Executor::start(0, options, [](const tunedist::core::OpContext&) {});
  std::atomic<int> policy{-1};
  auto work = executor->launch(c10d::OpType::BARRIER, "tuned:barrier", {}, {}, true, kTimeout, 0,
                               [&policy](const tunedist::core::OpContext&) { policy = sched_getscheduler(0); });
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
  tunedist::cpu::Executor::Options batch;
  CHECK(batch.batchWorker);
  CHECK(workerPolicy(batch) == SCHED_BATCH);
  // The caller's own thread is untouched.
  CHECK(sched_getscheduler(0) == SCHED_OTHER);
}

TEST_CASE("executor: TUNEDIST_WORKER_SCHED chooses the worker's policy and rejects anything else",
          "[backend][executor]") {
  {
    ScopedEnv env("TUNEDIST_WORKER_SCHED", "normal");
    auto options = tunedist::cpu::Executor::Options::fromEnv();
    CHECK_FALSE(options.batchWorker);
    CHECK(workerPolicy(options) == SCHED_OTHER);
  }
  {
    ScopedEnv env("TUNEDIST_WORKER_SCHED", "batch");
    CHECK(tunedist::cpu::Executor::Options::fromEnv().batchWorker);
  }
  {
    ScopedEnv env("TUNEDIST_WORKER_SCHED", "fifo");
    CHECK_THROWS_WITH(tunedist::cpu::Executor::Options::fromEnv(), Catch::Contains("TUNEDIST_WORKER_SCHED") &&
                                                                       Catch::Contains("batch or normal") &&
                                                                       Catch::Contains("fifo"));
  }
}

namespace {

// Launches one synchronous operation on `executor` that records that it ran; returns whether it got a Work back.
bool syncCallReturnsWork(tunedist::cpu::Executor& executor, bool& ran) {
  ran = false;
  auto work = executor.launch(c10d::OpType::ALLREDUCE, "tuned:all_reduce", {}, {}, false, kTimeout, 0,
                              [&ran](const tunedist::core::OpContext&) { ran = true; });
  if (work) {
    CHECK(work->isCompleted());
    work->wait();
  }
  return static_cast<bool>(work);
}

}  // namespace

TEST_CASE("executor: a synchronous call that runs inline returns no Work unless something needs one",
          "[backend][executor]") {
  auto executor = tunedist::cpu::Executor::start(0, {}, [](const tunedist::core::OpContext&) {});
  bool ran = false;
  CHECK_FALSE(syncCallReturnsWork(*executor, ran));
  CHECK(ran);
  CHECK(executor->lastSeq() == 1);  // it still takes a sequence number
  // An asynchronous call always returns one.
  auto async = executor->launch(c10d::OpType::ALLREDUCE, "tuned:all_reduce", {}, {}, true, kTimeout, 0,
                                [](const tunedist::core::OpContext&) {});
  REQUIRE(async);
  async->wait();
  // A profiler listening on this thread: the Work carries its event.
  {
    auto handle = at::addThreadLocalCallback(
        at::RecordFunctionCallback([](const at::RecordFunction&) -> std::unique_ptr<at::ObserverContext> {
          return nullptr;
        }).scopes({at::RecordScope::USER_SCOPE}));
    CHECK(syncCallReturnsWork(*executor, ran));
    at::removeCallback(handle);
  }
  CHECK_FALSE(syncCallReturnsWork(*executor, ran));
  // torch registering every Work for wait_tensor (allow_inflight_collective_as_graph_input).
  c10d::set_allow_inflight_collective_as_graph_input(true);
  const bool inflight = syncCallReturnsWork(*executor, ran);
  c10d::set_allow_inflight_collective_as_graph_input(false);
  CHECK(inflight);
  // Its failure comes out of the call, as a DistBackendError naming the op.
  CHECK_THROWS_AS(executor->launch(c10d::OpType::ALLREDUCE, "tuned:all_reduce", {}, {}, false, kTimeout, 0,
                                   [](const tunedist::core::OpContext&) { throw std::runtime_error("boom"); }),
                  c10::DistBackendError);
  executor->shutdown();
  // syncReturnsWork: always a Work.
  tunedist::cpu::Executor::Options always;
  always.syncReturnsWork = true;
  auto withWork = tunedist::cpu::Executor::start(0, always, [](const tunedist::core::OpContext&) {});
  CHECK(syncCallReturnsWork(*withWork, ran));
  CHECK(ran);
  withWork->shutdown();
}

TEST_CASE("executor: TUNEDIST_SYNC_WORK chooses whether synchronous calls return a Work and rejects anything else",
          "[backend][executor]") {
  CHECK_FALSE(tunedist::cpu::Executor::Options{}.syncReturnsWork);
  {
    tunedist::test::ScopedEnv env("TUNEDIST_SYNC_WORK", "always");
    CHECK(tunedist::cpu::Executor::Options::fromEnv().syncReturnsWork);
  }
  {
    tunedist::test::ScopedEnv env("TUNEDIST_SYNC_WORK", "inline-none");
    CHECK_FALSE(tunedist::cpu::Executor::Options::fromEnv().syncReturnsWork);
  }
  {
    // torch's flight recorder closes an entry only for a call that returned a Work.
    tunedist::test::ScopedEnv recorder("TUNEDIST_FLIGHT_RECORDER", " On");
    CHECK(tunedist::cpu::Executor::Options::fromEnv().syncReturnsWork);
    tunedist::test::ScopedEnv env("TUNEDIST_SYNC_WORK", "inline-none");
    CHECK_FALSE(tunedist::cpu::Executor::Options::fromEnv().syncReturnsWork);
  }
  {
    tunedist::test::ScopedEnv recorder("TUNEDIST_FLIGHT_RECORDER", "0");
    CHECK_FALSE(tunedist::cpu::Executor::Options::fromEnv().syncReturnsWork);
  }
  {
    tunedist::test::ScopedEnv env("TUNEDIST_SYNC_WORK", "never");
    CHECK_THROWS_WITH(tunedist::cpu::Executor::Options::fromEnv(), Catch::Contains("TUNEDIST_SYNC_WORK") &&
                                                                       Catch::Contains("inline-none or always") &&
                                                                       Catch::Contains("never"));
  }
}
