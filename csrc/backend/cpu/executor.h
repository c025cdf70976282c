// Executor: runs a group's operations one at a time, in issue order, so that DDP's bucket all-reduces overlap the
// backward pass while every rank still runs the same sequence.
//
//   * launch() takes the next per-group sequence number, wraps the operation in a TunedWork and queues it; one
//     worker thread runs the queue.
//   * A synchronous call (async_op=False) with nothing queued runs inline on the caller's thread: no hand-off. So
//     does an asynchronous one where Options::inlineAsync says so (a group of one rank). A synchronous one runs
//     through runNow(), without making a Work at all: launch() then returns an empty Work pointer
//     (Options::syncReturnsWork).
//   * A thread that waits for a queued Work runs the queue itself while the worker is idle (helpUntil): waking the
//     worker costs 50-200 us on a virtual machine.
//   * A future callback on the worker that issues another operation and waits for it (torch's PowerSGD hook does)
//     would deadlock the queue: the worker then retires and a fresh thread takes over (retireWorkerLocked).
//   * Inside a coalescing block (startCoalescing .. endCoalescing) every Work is recorded; endCoalescing returns
//     one Work that completes when all of them have.
//
// Every operation runs `prepare` (the CPU side's one-time verification of the group's hosts) before its body. Where a
// completion hook is registered (hooks()), each operation that succeeds is reported to it with its time stamps.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/cpu/completion_hooks.h"
#include "backend/cpu/work.h"
#include "core/op_context.h"

namespace tunedist::cpu {

class Executor : public std::enable_shared_from_this<Executor> {
 public:
  // What one operation runs on the worker (or inline); gets the operation's context with its deadline.
  using Body = std::function<void(const core::OpContext&)>;
  using Prepare = std::function<void(const core::OpContext&)>;

  struct Options {
    // Synchronous calls up to this many bytes may run inline on the caller's thread when nothing is queued.
    size_t inlineMaxBytes = size_t(64) << 20;
    // Asynchronous calls may too (same bounds). For a group of one rank: it has nobody to wait for, so an async
    // call is a bounded local copy at most, and handing it to the worker costs a futex wake and a race with the
    // waiter (measured: async + wait() 13-20 us against 12-13 us for the synchronous call).
    bool inlineAsync = false;
    // The worker thread runs under SCHED_BATCH (Linux): the same CPU share as any other thread, but waking it does
    // not preempt the thread running on that CPU. A rank that queues an async call and waits for it at once (FSDP's
    // all_gather, a tensor-parallel layer) then keeps its CPU, finds the worker still asleep and runs the call
    // itself (helpUntil); a worker woken as a normal thread took the CPU from the caller first and cost two context
    // switches. Measured at world size 2 on a 2-vCPU AMD EPYC (Zen 4), 4 rounds
    // (docs/performance.md#the-per-call-budget-and-the-direct-operators): async
    // all_reduce + wait() medians 19.3 -> 8.1 us at 4 KiB, 20.4 -> 11.1 at 16 KiB, 27.3 -> 20.8 at 64 KiB (the
    // synchronous call: 8-11, 20 us); DDP's main job unchanged. On an idle CPU the worker starts at once either way.
    // TUNEDIST_WORKER_SCHED=normal keeps the worker a normal thread.
    bool batchWorker = true;
    // false: a synchronous call (asyncOp false) that runs inline returns no Work (an empty pointer), torch's contract
    // for a backend that synchronised at the C++ level: since torch 2.8 every torch.distributed collective that
    // passes async_op waits only on a Work it got back ("work is not None"), and asyncOp is false only there. That
    // skips making and destroying the Work, pybind's Python object for it and the Python wait() call: 1.1-1.2 us
    // of a 7-8 us dist.all_reduce of 16 KiB at world size 2 on a 2-vCPU AMD EPYC (AVX2)
    // (docs/performance.md#the-per-call-budget-and-the-direct-operators). A Work is still
    // made while the calling thread has profiler callbacks (it carries the tuned:* event), under
    // allow_inflight_collective_as_graph_input (torch registers it for wait_tensor), and whenever the call is
    // queued. true (TUNEDIST_SYNC_WORK=always): every call returns a Work, for C++ callers that set asyncOp = false
    // and wait on the result without checking it; also the default under TUNEDIST_FLIGHT_RECORDER=1, since torch's
    // flight recorder closes a call's entry only when the call returned a Work.
    bool syncReturnsWork = false;

    // Defaults overridden by TUNEDIST_WORKER_SCHED (batch | normal) and TUNEDIST_SYNC_WORK (inline-none | always)
    // where set (TUNEDIST_FLIGHT_RECORDER on: always); throws naming the variable on anything else.
    static Options fromEnv();
  };

  // Makes an executor and starts its worker thread. Call shutdown() before the objects `prepare` refers to go
  // away: the worker threads hold the executor until they end.
  static std::shared_ptr<Executor> start(int rank, Options options, Prepare prepare);
  // Use start(); public only for std::make_shared.
  Executor(int rank, Options options, Prepare prepare);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Queues (or runs inline) one operation and returns its Work, or an empty pointer for a synchronous call that ran
  // inline and needs none (Options::syncReturnsWork). `name` is the profiler title ("tuned:all_reduce");
  // `timeout` is the operation's own (already resolved against the group's default). `body` is any callable taking
  // the OpContext: a call that runs inline calls it as it is, and only a queued one pays for a Body (an allocation).
  template <typename F>
  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, const char* name, std::vector<at::Tensor> outputs,
                                        const std::vector<at::Tensor>& inputs, bool asyncOp,
                                        std::chrono::milliseconds timeout, size_t bytes, F&& body);
  // Records a Work made outside launch() (send/recv) in the coalesced block being built, if any.
  void trackWork(const c10::intrusive_ptr<c10d::Work>& work);
  void startCoalescing();
  // The Works recorded since startCoalescing, as one Work (a completed one when there were none).
  c10::intrusive_ptr<c10d::Work> endCoalescing(std::chrono::milliseconds timeout);
  // How many Works the open coalescing block holds so far.
  size_t coalescedCount();

  // The sequence number of the last launched operation.
  uint64_t lastSeq();
  // The group's completion hooks (CpuBackend registers them here).
  CompletionHooks& hooks() { return *hooks_; }
  // The kind of the first operation failure this group saw (c10d::ErrorType::SUCCESS while there was none):
  // TIMEOUT for a deadline passed, REMOTE_ERROR for a peer found dead, COMM_ERROR for any other failure (a peer
  // that failed the group, mismatched calls, an OS error).
  c10d::ErrorType error() const { return c10d::ErrorType(error_.load(std::memory_order_acquire)); }
  bool stopped();
  // Stops the worker after the queued operations; later launches fail naming the op and rank. Idempotent.
  void shutdown();

 private:
  using Clock = CompletionHooks::Clock;
  // What the completion hooks are told of an operation besides its sequence number. `issued` is the epoch when no
  // hook was registered at launch: the operation is then neither timed nor reported.
  struct Issue {
    c10d::OpType type;
    Clock::time_point issued;
    uint64_t completionKey = 0;
  };
  struct Item {
    c10::intrusive_ptr<TunedWork> work;
    Body body;
    std::chrono::milliseconds timeout;
    const char* name;
    Issue issue;
  };

  // Whether a synchronous call that runs inline may return no Work (Options::syncReturnsWork): no profiler callbacks
  // on this thread, torch not registering Works for wait_tensor.
  bool syncMayOmitWork() const;
  // launch() of a synchronous call without a Work: runs it on the caller's thread now where it may run inline
  // (nothing queued or running, no coalescing block) and returns true, with the next sequence number, throwing its
  // failure as that Work's wait() would (a c10::DistBackendError). Otherwise runs nothing and returns false.
  template <typename F>
  bool runNow(const char* name, std::chrono::milliseconds timeout, size_t bytes, F&& body, const Issue& issue);
  // With mutex_ held: refuses a call after shutdown, naming it.
  void checkOpenLocked(const char* name) const;
  // With mutex_ held: the next sequence number and its Work (recorded in an open coalescing block).
  c10::intrusive_ptr<TunedWork> admitLocked(c10d::OpType type, const char* name, std::vector<at::Tensor> outputs,
                                            const std::vector<at::Tensor>& inputs, std::chrono::milliseconds timeout);
  // With mutex_ held: whether this call may run on the caller's thread now (nothing queued or running).
  bool mayRunInlineLocked(bool asyncOp, size_t bytes) const;
  // With mutex_ held: queues the operation; the caller wakes the worker (cv_) once it has released the lock.
  void enqueueLocked(const c10::intrusive_ptr<TunedWork>& work, Body body, std::chrono::milliseconds timeout,
                     const char* name, const Issue& issue);
  // The context an operation runs with: its name as users call it, its sequence number and deadline.
  static core::OpContext contextFor(uint64_t seq, const char* name, std::chrono::milliseconds timeout);
  // Runs `prepare` and then the operation's body (queued or inline) without the lock; returns its failure, if any.
  // Reports a success to the completion hooks when `issue` was stamped.
  template <typename F>
  std::exception_ptr runBody(uint64_t seq, const char* name, std::chrono::milliseconds timeout, F& body,
                             const Issue& issue);
  // The key torch's completion hooks know `work` by (Work::getCompletionKey).
  static uint64_t completionKeyOf(const c10d::Work& work);
  // Keeps the first failure's kind for error().
  void noteFailure(const std::exception& e);
  // After a run, with the lock not held: frees the engine for the queue, then completes the Work (its callbacks
  // run on this thread).
  void finishRun(TunedWork& work, std::exception_ptr error);

  void workerLoop();
  // Applies Options::batchWorker to the calling (worker) thread.
  void applyWorkerPolicy() const;
  // Completes the operation's Work (runs its future's callbacks).
  static void settle(TunedWork& work, std::exception_ptr error);
  void retireWorkerLocked();
  void releaseEngineLocked();
  void helpUntil(const TunedWork& work);
  void runNextLocked(std::unique_lock<std::mutex>& lock);
  void runLocked(Item& item, std::unique_lock<std::mutex>& lock);

  const int rank_;
  const Options options_;
  const Prepare prepare_;
  const std::shared_ptr<CompletionHooks> hooks_;
  std::atomic<int> error_{int(c10d::ErrorType::SUCCESS)};

  std::mutex mutex_;
  std::condition_variable cv_;
  uint64_t seq_ = 0;
  std::deque<Item> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread worker_;
  std::vector<std::thread> retired_;  // former workers, still inside future callbacks or finishing them
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;
};

template <typename F>
c10::intrusive_ptr<c10d::Work> Executor::launch(c10d::OpType type, const char* name, std::vector<at::Tensor> outputs,
                                                const std::vector<at::Tensor>& inputs, bool asyncOp,
                                                std::chrono::milliseconds timeout, size_t bytes, F&& body) {
  Issue issue{type, hooks_->stamp()};
  if (!asyncOp && syncMayOmitWork() && runNow(name, timeout, bytes, body, issue)) {
    return {};
  }
  std::unique_lock<std::mutex> lock(mutex_);
  auto work = admitLocked(type, name, std::move(outputs), inputs, timeout);
  if (issue.issued != Clock::time_point{}) {
    issue.completionKey = completionKeyOf(*work);
  }
  if (!mayRunInlineLocked(asyncOp, bytes)) {
    enqueueLocked(work, Body(std::forward<F>(body)), timeout, name, issue);
    lock.unlock();
    // After unlocking: a worker woken while we still hold the lock would at once block on it and need a second wake.
    cv_.notify_all();
    return work;
  }
  // Nothing ahead of us: run on the caller's thread and skip the hand-off to the worker.
  busy_ = true;
  lock.unlock();
  finishRun(*work, runBody(work->getSequencenumber(), name, timeout, body, issue));
  return work;
}

template <typename F>
bool Executor::runNow(const char* name, std::chrono::milliseconds timeout, size_t bytes, F&& body, const Issue& issue) {
  std::unique_lock<std::mutex> lock(mutex_);
  checkOpenLocked(name);
  if (!mayRunInlineLocked(false, bytes)) {
    return false;
  }
  const uint64_t seq = ++seq_;
  busy_ = true;
  lock.unlock();
  std::exception_ptr error = runBody(seq, name, timeout, body, issue);
  lock.lock();
  releaseEngineLocked();
  lock.unlock();
  if (error) {
    std::rethrow_exception(asDistBackendError(std::move(error)));
  }
  return true;
}

template <typename F>
std::exception_ptr Executor::runBody(uint64_t seq, const char* name, std::chrono::milliseconds timeout, F& body,
                                     const Issue& issue) {
  const core::OpContext ctx = contextFor(seq, name, timeout);
  const bool followed = issue.issued != Clock::time_point{};
  const Clock::time_point started = followed ? Clock::now() : Clock::time_point{};
  try {
    prepare_(ctx);
    body(ctx);
  } catch (const std::exception& e) {
    noteFailure(e);
    return std::current_exception();
  }
  if (followed) {
    hooks_->report({issue.type, seq, issue.issued, started, Clock::now(), issue.completionKey});
  }
  return nullptr;
}

}  // namespace tunedist::cpu
