#include "backend/cpu/executor.h"

#include <c10/util/Exception.h>
#include <sched.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>
#include <utility>

#include "core/env.h"
#include "core/error.h"

namespace tunedist::cpu {

// Each worker thread holds the executor: a worker that outlives shutdown() (detached because it dropped the last
// reference to the backend from inside a callback) still finds its executor when the callback returns.
std::shared_ptr<Executor> Executor::start(int rank, Options options, Prepare prepare) {
  auto executor = std::make_shared<Executor>(rank, options, std::move(prepare));
  std::lock_guard<std::mutex> lock(executor->mutex_);
  executor->worker_ = std::thread([self = executor] { self->workerLoop(); });
  return executor;
}

Executor::Options Executor::Options::fromEnv() {
  Options o;
  if (auto v = core::envString("TUNEDIST_WORKER_SCHED")) {
    TD_CHECK(*v == "batch" || *v == "normal", "tunedist: TUNEDIST_WORKER_SCHED must be batch or normal, got '", *v,
             "'");
    o.batchWorker = *v == "batch";
  }
  if (auto v = core::envString("TUNEDIST_SYNC_WORK")) {
    TD_CHECK(*v == "inline-none" || *v == "always", "tunedist: TUNEDIST_SYNC_WORK must be inline-none or always, got '",
             *v, "'");
    o.syncReturnsWork = *v == "always";
  } else if (auto fr = core::envString("TUNEDIST_FLIGHT_RECORDER")) {
    // torch's flight-recorder hook (which `import tunedist` attaches only under this variable, as
    // tunedist.flight_recorder_enabled() reads it) closes a call's entry in its post-hook only when the call returned
    // a Work: without one, every synchronous call would sit in its dumps as never finished, as a hung one does.
    std::string value = *fr;
    value.erase(0, value.find_first_not_of(" \t"));
    value.erase(value.find_last_not_of(" \t") + 1);
    std::transform(value.begin(), value.end(), value.begin(), [](unsigned char c) { return std::tolower(c); });
    o.syncReturnsWork = value == "1" || value == "true" || value == "yes" || value == "on";
  }
  return o;
}

// torch reads allow_inflight_collective_as_graph_input again after the call returns (ProcessGroup::allreduce and the
// others register the Work for wait_tensor then): a thread that switches it on while another thread's synchronous
// call runs inline on a tuned group would have torch register an empty Work. torch's own flag is a plain global, set
// by a context manager on the thread that traces; no guard here can close that window.
bool Executor::syncMayOmitWork() const {
  return !options_.syncReturnsWork && !profilerCallbacksActive() && !c10d::allow_inflight_collective_as_graph_input();
}

Executor::Executor(int rank, Options options, Prepare prepare)
    : rank_(rank), options_(options), prepare_(std::move(prepare)), hooks_(std::make_shared<CompletionHooks>(rank)) {}

Executor::~Executor() { shutdown(); }

void Executor::noteFailure(const std::exception& e) {
  c10d::ErrorType kind = c10d::ErrorType::COMM_ERROR;
  switch (core::failureKindOf(e)) {
    case core::FailureKind::kTimeout: kind = c10d::ErrorType::TIMEOUT; break;
    case core::FailureKind::kPeerDead: kind = c10d::ErrorType::REMOTE_ERROR; break;
    case core::FailureKind::kError: break;
  }
  int none = int(c10d::ErrorType::SUCCESS);
  error_.compare_exchange_strong(none, int(kind), std::memory_order_acq_rel);
}

uint64_t Executor::completionKeyOf(const c10d::Work& work) {
#ifdef TUNEDIST_C10D_HAS_COMPLETION_HOOKS
  return work.getCompletionKey();
#else
  return uint64_t(reinterpret_cast<uintptr_t>(&work));
#endif
}

void Executor::checkOpenLocked(const char* name) const {
  TORCH_CHECK(!stop_, "tunedist: ", name, " on rank ", rank_, ": the process group was shut down or aborted");
}

c10::intrusive_ptr<TunedWork> Executor::admitLocked(c10d::OpType type, const char* name,
                                                    std::vector<at::Tensor> outputs,
                                                    const std::vector<at::Tensor>& inputs,
                                                    std::chrono::milliseconds timeout) {
  checkOpenLocked(name);
  auto work = c10::make_intrusive<TunedWork>(rank_, type, name, ++seq_, std::move(outputs), inputs, timeout);
  if (coalescing_) {
    coalesced_.push_back(work);
  }
  return work;
}

bool Executor::mayRunInlineLocked(bool asyncOp, size_t bytes) const {
  return (!asyncOp || options_.inlineAsync) && !busy_ && queue_.empty() && !coalescing_ &&
         bytes <= options_.inlineMaxBytes && std::this_thread::get_id() != worker_.get_id();
}

void Executor::enqueueLocked(const c10::intrusive_ptr<TunedWork>& work, Body body, std::chrono::milliseconds timeout,
                             const char* name, const Issue& issue) {
  if (std::this_thread::get_id() == worker_.get_id()) {
    retireWorkerLocked();
  } else {
    // A thread that waits for this Work runs the queue itself while the worker is idle (helpUntil).
    work->setHelper([weak = weak_from_this()](const TunedWork& w) {
      if (auto self = weak.lock()) {
        self->helpUntil(w);
      }
    });
  }
  queue_.push_back(Item{work, std::move(body), timeout, name, issue});
}

core::OpContext Executor::contextFor(uint64_t seq, const char* name, std::chrono::milliseconds timeout) {
  // Messages name the op as users call it ("all_reduce"), not by its profiler title ("tuned:all_reduce").
  const char* opName = std::string_view(name).substr(0, 6) == "tuned:" ? name + 6 : name;
  return core::OpContext{opName, seq, std::chrono::steady_clock::now() + timeout};
}

void Executor::finishRun(TunedWork& work, std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    releaseEngineLocked();
  }
  settle(work, std::move(error));
}

// Called with mutex_ held when an operation leaves the engine. Only the worker sleeps on cv_, and it has something
// to do only if work is queued: waking it otherwise costs a futex wake and a context switch per inline call.
void Executor::releaseEngineLocked() {
  busy_ = false;
  if (!queue_.empty()) {
    cv_.notify_all();
  }
}

// The worker may take the next item first; the waiter then falls back to waiting for its completion.
void Executor::helpUntil(const TunedWork& work) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!work.finished() && !busy_ && !stop_ && !queue_.empty()) {
    runNextLocked(lock);
  }
}

// Called with mutex_ held (through `lock`), the engine free and the queue non-empty: runs the next operation on
// this thread (runLocked).
void Executor::runNextLocked(std::unique_lock<std::mutex>& lock) {
  Item item = std::move(queue_.front());
  queue_.pop_front();
  runLocked(item, lock);
}

// Called with mutex_ held (through `lock`) and the engine free: runs `item` on this thread, without the lock while it
// runs and while its callbacks run; returns with the lock held. The engine is released before the callbacks, so the
// next operation may start (on a replacement worker, see retireWorkerLocked) while this thread runs the callbacks
// of the finished one.
void Executor::runLocked(Item& item, std::unique_lock<std::mutex>& lock) {
  busy_ = true;
  lock.unlock();
  finishRun(*item.work, runBody(item.work->getSequencenumber(), item.name, item.timeout, item.body, item.issue));
  lock.lock();
}

// A scheduling hint only: where the system refuses it (a seccomp profile), the worker stays a normal thread.
void Executor::applyWorkerPolicy() const {
  if (options_.batchWorker) {
    sched_param param{};
    param.sched_priority = 0;
    (void)sched_setscheduler(0, SCHED_BATCH, &param);
  }
}

void Executor::workerLoop() {
  applyWorkerPolicy();
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    // No polling before sleeping: a spinning worker takes a core from the ranks' compute on a small machine, and a
    // caller that waits for its Work runs the queue itself (helpUntil) instead of paying for the wake-up.
    cv_.wait(lock, [this] { return stop_ || (!busy_ && !queue_.empty()); });
    if (queue_.empty() && stop_) {
      return;
    }
    runNextLocked(lock);
    if (std::this_thread::get_id() != worker_.get_id()) {
      return;  // retired while in the callbacks: the replacement owns the queue now
    }
  }
}

// A future callback that runs on the worker thread (Work::getFuture()->then(...)) may issue another collective
// and wait for it, as torch's PowerSGD hook does. That collective is queued behind nothing, but the only thread
// that runs the queue is the one blocked in the callback. So the caller's thread stops being the worker: a fresh
// thread takes over the queue (issue order is kept: it starts with the next queued item), and the old one ends
// when its callbacks return. This costs a thread start only in that case.
void Executor::retireWorkerLocked() {
  retired_.push_back(std::move(worker_));
  worker_ = std::thread([self = shared_from_this()] { self->workerLoop(); });
}

void Executor::settle(TunedWork& work, std::exception_ptr error) {
  if (error) {
    work.completeWithError(std::move(error));
  } else {
    work.complete();
  }
}

void Executor::trackWork(const c10::intrusive_ptr<c10d::Work>& work) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (coalescing_) {
    coalesced_.push_back(work);
  }
}

void Executor::startCoalescing() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(!coalescing_, "tunedist: startCoalescing on rank ", rank_, ": already coalescing");
  coalescing_ = true;
  coalesced_.clear();
}

size_t Executor::coalescedCount() {
  std::lock_guard<std::mutex> lock(mutex_);
  return coalesced_.size();
}

c10::intrusive_ptr<c10d::Work> Executor::endCoalescing(std::chrono::milliseconds timeout) {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(coalescing_, "tunedist: endCoalescing on rank ", rank_, " without startCoalescing");
    coalescing_ = false;
    works.swap(coalesced_);
  }
  if (works.empty()) {
    // Nothing was coalesced. torch's _abort_process_group wraps abort() in a coalescing block on the accelerator's
    // backend (this one, for cuda:tuned, even without a GPU), so this runs after shutdown too: a completed Work,
    // without the worker.
    auto work = c10::make_intrusive<TunedWork>(rank_, c10d::OpType::COALESCED, "tuned:coalesced", lastSeq(),
                                               std::vector<at::Tensor>{}, c10::ArrayRef<at::Tensor>{}, timeout);
    work->complete();
    return work;
  }
  // The coalesced operations already run in issue order; one Work that completes when all of them have.
  std::vector<at::Tensor> outputs;
  for (auto& w : works) {
    auto* tw = dynamic_cast<TunedWork*>(w.get());
    if (tw != nullptr) {
      outputs.insert(outputs.end(), tw->outputs().begin(), tw->outputs().end());
    }
  }
  return launch(c10d::OpType::COALESCED, "tuned:coalesced", outputs, {}, true, timeout, 0,
                [works](const core::OpContext& ctx) {
                  for (const auto& w : works) {
                    w->wait(std::chrono::duration_cast<std::chrono::milliseconds>(ctx.deadline -
                                                                                  std::chrono::steady_clock::now()));
                  }
                });
}

bool Executor::stopped() {
  std::lock_guard<std::mutex> lock(mutex_);
  return stop_;
}

uint64_t Executor::lastSeq() {
  std::lock_guard<std::mutex> lock(mutex_);
  return seq_;
}

void Executor::shutdown() {
  std::vector<std::thread> threads;
  std::deque<Item> orphans;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    cv_.notify_all();
    threads.swap(retired_);
    threads.push_back(std::move(worker_));
    for (const auto& t : threads) {
      if (t.get_id() == std::this_thread::get_id()) {
        // A callback on a worker dropped the last reference to the group: no thread will join this one, and what
        // is still queued would run against a destroyed backend. Fail it instead.
        orphans.swap(queue_);
      }
    }
  }
  for (auto& item : orphans) {
    settle(*item.work,
           std::make_exception_ptr(core::Error(c10::str("tunedist: ", item.name, " on rank ", rank_,
                                                        ": the process group was destroyed while it was queued"))));
  }
  for (auto& t : threads) {
    if (!t.joinable()) {
      continue;
    }
    // Called from a worker thread itself (a callback that dropped the last reference): it cannot join itself.
    if (t.get_id() == std::this_thread::get_id()) {
      t.detach();
    } else {
      t.join();
    }
  }
  // A worker that was running an operation when stop_ was set leaves the loop as a retired one (worker_ was taken
  // above), so what is still queued would never run and its waiters would wait out their timeout: fail it.
  std::deque<Item> unrun;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    unrun.swap(queue_);
  }
  for (auto& item : unrun) {
    settle(*item.work, std::make_exception_ptr(
                           core::Error(c10::str("tunedist: ", item.name, " on rank ", rank_,
                                                ": the process group was shut down or aborted before it ran"))));
  }
  // Every operation has finished or failed: the WorkInfo hook runs for what was reported, then its thread ends.
  hooks_->shutdown();
}

}  // namespace tunedist::cpu
