// TunedBackend: construction, the worker thread, launching operations, coalescing, abort and shutdown. The
// collectives themselves live in ops/, one file each.
#include "backend/backend.h"

#include <c10/util/Exception.h>

#include <cstring>

#include "backend/store_rendezvous.h"
#include "shm/error.h"
#include "shm/sync.h"
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
                                                       GlooFactory glooFactory) {
  Options options;
  if (timeout.count() > 0) {
    options.timeout = timeout;
  }
  options.glooFactory = std::move(glooFactory);
  return c10::make_intrusive<TunedBackend>(store, rank, size, options);
}

TunedBackend::TunedBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Options options)
    : c10d::Backend(rank, size), store_(store), options_(std::move(options)) {
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
  std::lock_guard<std::mutex> lock(mutex_);
  options_.timeout = timeout;
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
    busy_ = true;
    lock.unlock();
    run(item);
    lock.lock();
    busy_ = false;
    cv_.notify_all();
    return work;
  }
  queue_.push_back(std::move(item));
  queued_.fetch_add(1, std::memory_order_release);
  cv_.notify_all();
  return work;
}

void TunedBackend::workerLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (queue_.empty() && !stop_) {
      // Poll briefly before sleeping: waking a sleeping thread costs 50-200 us on virtual machines, more than a
      // small collective, and DDP issues its buckets back to back.
      lock.unlock();
      auto until = std::chrono::steady_clock::now() + kWorkerPoll;
      while (queued_.load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < until) {
        shm::cpuRelax();
      }
      lock.lock();
    }
    cv_.wait(lock, [this] { return stop_ || (!busy_ && !queue_.empty()); });
    if (queue_.empty() && stop_) {
      return;
    }
    Item item = std::move(queue_.front());
    queue_.pop_front();
    queued_.fetch_sub(1, std::memory_order_release);
    busy_ = true;
    lock.unlock();
    run(item);
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

void TunedBackend::run(Item& item) {
  // Messages name the op as users call it ("all_reduce"), not by its profiler title ("tuned:all_reduce").
  const char* opName = std::strncmp(item.name, "tuned:", 6) == 0 ? item.name + 6 : item.name;
  shm::OpContext ctx{opName, item.work->getSequencenumber(), std::chrono::steady_clock::now() + item.timeout};
  try {
    prepareCollective(ctx);
    item.body(ctx);
  } catch (const std::exception&) {
    item.work->completeWithError(std::current_exception());
    return;
  }
  item.work->complete();
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
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(coalescing_, "tunedist: endCoalescing on rank ", rank_, " without startCoalescing");
    coalescing_ = false;
    works.swap(coalesced_);
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

void TunedBackend::abort() {
  abortEngines(c10::str("tunedist: rank ", rank_, " aborted the process group"));
  shutdown();
}

void TunedBackend::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_ && !worker_.joinable()) {
      return;
    }
    stop_ = true;
    cv_.notify_all();
  }
  if (worker_.joinable() && std::this_thread::get_id() != worker_.get_id()) {
    worker_.join();
  }
}

}  // namespace tunedist
