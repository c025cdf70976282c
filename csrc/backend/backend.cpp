// TunedBackend: construction, the worker thread, launching operations, coalescing, abort and shutdown. The
// collectives themselves live in ops/, one file each.
#include "backend/backend.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "backend/store_rendezvous.h"
#include "core/error.h"
#include "core/sync.h"
#include "tunedist/tunedist.h"

#ifndef TUNEDIST_TORCH_VERSION
#define TUNEDIST_TORCH_VERSION "unknown"
#endif

namespace tunedist {

c10::intrusive_ptr<c10d::Backend> createBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                std::chrono::milliseconds timeout) {
  return TunedBackend::create(store, rank, size, timeout);
}

std::string versionString() { return std::string("tunedist 0.1.0 (torch ") + TUNEDIST_TORCH_VERSION + ")"; }

c10::intrusive_ptr<c10d::Backend> TunedBackend::create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                       int size, std::chrono::milliseconds timeout,
                                                       NcclSide::CreatedHook onNcclCreated,
                                                       GlooFactory glooFactory) {
  Options options;
  if (timeout.count() > 0) {
    options.timeout = timeout;
  }
  options.onNcclCreated = std::move(onNcclCreated);
  options.glooFactory = std::move(glooFactory);
  return c10::make_intrusive<TunedBackend>(store, rank, size, options);
}

TunedBackend::TunedBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Options options)
    : c10d::Backend(rank, size),
      store_(store),
      options_(std::move(options)),
      nccl_(store, rank, size, NcclSide::Options{options_.timeout, options_.onNcclCreated}) {
  TORCH_CHECK(store_, "tunedist: TunedBackend on rank ", rank, " needs a store");
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "tunedist: invalid rank ", rank, " for a group of ", size);
  rendezvous_ = std::make_shared<StoreRendezvous>(store_);
  // One store write, no waiting: the engines are made at the first operation, once every rank's key is in.
  discovery_ = std::make_unique<shm::HostDiscovery>(rendezvous_, rank, size, options_.shm.shmDir);
  discovery_->publish(shm::HostKey{shm::hostLabelFromEnv(), shm::shareableMemoryFingerprint(options_.shm.shmDir)});
  worker_ = std::thread([this] { workerLoop(); });
}

TunedBackend::~TunedBackend() { shutdown(); }

std::chrono::milliseconds TunedBackend::effectiveTimeout(std::chrono::milliseconds requested) const {
  return requested.count() > 0 ? requested : options_.timeout;
}

void TunedBackend::setTimeout(std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    options_.timeout = timeout;
  }
  nccl_.setTimeout(timeout);
}

uint64_t TunedBackend::getSequenceNumberForGroup() {
  std::lock_guard<std::mutex> lock(mutex_);
  return seq_;
}

void TunedBackend::rejectCall(const char* op, const std::string& message) {
  std::string full = c10::str("tunedist: ", op, " on rank ", rank_, " of ", size_, ": ", message);
  // Peers may already be waiting for this rank inside the same operation: fail the group so they stop too.
  try {
    hostLayout(std::chrono::steady_clock::now() + options_.timeout);
  } catch (const std::exception&) {
    // Without the layout there are no engines to fail; the peers then time out finding the hosts.
  }
  abortEngines(full);
  TORCH_CHECK(false, full);
}

c10::intrusive_ptr<c10d::Work> TunedBackend::launch(c10d::OpType type, const char* name,
                                                    std::vector<at::Tensor> outputs,
                                                    const std::vector<at::Tensor>& inputs, bool asyncOp,
                                                    std::chrono::milliseconds timeout, size_t bytes, Body body) {
  timeout = effectiveTimeout(timeout);
  std::unique_lock<std::mutex> lock(mutex_);
  TORCH_CHECK(!stop_, "tunedist: ", name, " on rank ", rank_, ": the process group was shut down or aborted");
  const uint64_t seq = ++seq_;
  auto work = c10::make_intrusive<TunedWork>(rank_, type, name, seq, std::move(outputs),
                                             std::optional<std::vector<at::Tensor>>(inputs), timeout);
  Item item{work, std::move(body), timeout, name};
  if (coalescing_) {
    coalesced_.push_back(work);
  }
  const bool onWorker = std::this_thread::get_id() == worker_.get_id();
  if (!asyncOp && !busy_ && queue_.empty() && !onWorker && bytes <= options_.inlineMaxBytes && !coalescing_) {
    // Nothing ahead of us: run on the caller's thread and skip the hand-off to the worker.
    runLocked(item, lock);
    return work;
  }
  if (onWorker) {
    retireWorkerLocked();
  } else {
    // A thread that waits for this Work runs the queue itself while the worker is idle (helpUntil).
    work->setHelper([weak = c10::weak_intrusive_ptr<TunedBackend>(c10::intrusive_ptr<TunedBackend>::reclaim_copy(this))](
                        const TunedWork& w) {
      if (auto self = weak.lock()) {
        self->helpUntil(w);
      }
    });
  }
  queue_.push_back(std::move(item));
  cv_.notify_all();
  return work;
}

// Called with mutex_ held when an operation leaves the engine. Only the worker sleeps on cv_, and it has something
// to do only if work is queued: waking it otherwise costs a futex wake and a context switch per inline call.
void TunedBackend::releaseEngineLocked() {
  busy_ = false;
  if (!queue_.empty()) {
    cv_.notify_all();
  }
}

// Waking the worker thread costs 50-200 us on a virtual machine and the waiter then sleeps too: a thread that waits
// for `work` runs queued operations itself, in issue order, while the engine is idle and `work` is still pending.
// The worker may take the next item first; the waiter then falls back to waiting for its completion.
void TunedBackend::helpUntil(const TunedWork& work) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!work.finished() && !busy_ && !stop_ && !queue_.empty()) {
    runNextLocked(lock);
  }
}

// Called with mutex_ held (through `lock`), the engine free and the queue non-empty: runs the next operation on
// this thread (runLocked).
void TunedBackend::runNextLocked(std::unique_lock<std::mutex>& lock) {
  Item item = std::move(queue_.front());
  queue_.pop_front();
  runLocked(item, lock);
}

// Called with mutex_ held (through `lock`) and the engine free: runs `item` on this thread, without the lock while it
// runs and while its callbacks run; returns with the lock held. The engine is released before the callbacks, so the
// next operation may start (on a replacement worker, see retireWorkerLocked) while this thread runs the callbacks
// of the finished one.
void TunedBackend::runLocked(Item& item, std::unique_lock<std::mutex>& lock) {
  busy_ = true;
  lock.unlock();
  std::exception_ptr error = execute(item);
  lock.lock();
  releaseEngineLocked();
  lock.unlock();
  settle(item, error);
  lock.lock();
}

void TunedBackend::workerLoop() {
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
void TunedBackend::retireWorkerLocked() {
  retired_.push_back(std::move(worker_));
  worker_ = std::thread([this] { workerLoop(); });
}

std::exception_ptr TunedBackend::execute(Item& item) {
  // Messages name the op as users call it ("all_reduce"), not by its profiler title ("tuned:all_reduce").
  const char* opName = std::strncmp(item.name, "tuned:", 6) == 0 ? item.name + 6 : item.name;
  shm::OpContext ctx{opName, item.work->getSequencenumber(), std::chrono::steady_clock::now() + item.timeout};
  try {
    prepareCollective(ctx);
    item.body(ctx);
  } catch (const std::exception&) {
    return std::current_exception();
  }
  return nullptr;
}

void TunedBackend::settle(Item& item, std::exception_ptr error) {
  if (error) {
    item.work->completeWithError(std::move(error));
  } else {
    item.work->complete();
  }
}

void TunedBackend::trackWork(const c10::intrusive_ptr<c10d::Work>& work) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (coalescing_) {
    coalesced_.push_back(work);
  }
}

void TunedBackend::startCoalescing() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(!coalescing_, "tunedist: startCoalescing on rank ", rank_, ": already coalescing");
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> TunedBackend::endCoalescing() {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  bool nccl = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(coalescing_, "tunedist: endCoalescing on rank ", rank_, " without startCoalescing");
    coalescing_ = false;
    works.swap(coalesced_);
    nccl = std::exchange(ncclCoalescing_, false);
  }
  if (nccl) {
    // The block's CUDA calls went to ProcessGroupNCCL, which returns the Work of the whole block.
    auto work = nccl_.existing()->endCoalescing();
    TORCH_CHECK(works.empty(), "tunedist: endCoalescing on rank ", rank_, ": the coalesced block mixed CPU and CUDA ",
                "operations; coalesce the operations of one device type at a time");
    return work;
  }
  if (works.empty()) {
    // Nothing was coalesced. torch's _abort_process_group wraps abort() in a coalescing block on the accelerator's
    // backend (this one, for cuda:tuned, even without a GPU), so this runs after shutdown too: a completed Work,
    // without the worker.
    auto work = c10::make_intrusive<TunedWork>(rank_, c10d::OpType::COALESCED, "tuned:coalesced",
                                               getSequenceNumberForGroup(), std::vector<at::Tensor>{}, std::nullopt,
                                               effectiveTimeout(c10d::kUnsetTimeout));
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
  return launch(c10d::OpType::COALESCED, "tuned:coalesced", outputs, {}, true, c10d::kUnsetTimeout, 0,
                [works](const shm::OpContext& ctx) {
                  for (const auto& w : works) {
                    w->wait(std::chrono::duration_cast<std::chrono::milliseconds>(
                        ctx.deadline - std::chrono::steady_clock::now()));
                  }
                });
}

c10::intrusive_ptr<c10d::Backend::Options> TunedBackend::getBackendOptions() {
  std::lock_guard<std::mutex> lock(mutex_);
  auto opts = c10::make_intrusive<c10d::Backend::Options>(getBackendName(), options_.timeout);
  opts->group_name = getGroupUid();
  return opts;
}

c10::intrusive_ptr<c10d::Backend> TunedBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                      const std::vector<int>& ranks,
                                                      const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  // `ranks` are ranks of this group; a rank outside them gets no backend (torch makes it a non-member).
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) {
    return nullptr;
  }
  for (int r : ranks) {
    TORCH_CHECK(r >= 0 && r < size_, "tunedist: split on rank ", rank_, ": rank ", r, " is not in the parent group of ",
                size_, " ranks");
  }
  Options child;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!stop_, "tunedist: split on rank ", rank_, ": the parent process group was shut down or aborted");
    child = options_;
  }
  if (opts && opts->timeout.count() > 0) {
    child.timeout = opts->timeout;
  }
  return c10::make_intrusive<TunedBackend>(store, int(it - ranks.begin()), int(ranks.size()), std::move(child));
}

void TunedBackend::abort() {
  abortEngines(c10::str("tunedist: rank ", rank_, " aborted the process group"));
  nccl_.abort();
  shutdown();
}

void TunedBackend::shutdown() {
  nccl_.shutdown();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    cv_.notify_all();
    threads.swap(retired_);
    threads.push_back(std::move(worker_));
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
}

}  // namespace tunedist
