// CompletionHooks: registration, reporting, and the WorkInfo hook's thread.
#include "backend/cpu/completion_hooks.h"

#include <c10/util/Exception.h>

#include <utility>
#include <vector>

namespace tunedist::cpu {

CompletionHooks::~CompletionHooks() { shutdown(); }

void CompletionHooks::refreshActiveLocked() {
  active_.store(!stop_ && (info_ != nullptr || !keyed_.empty()), std::memory_order_relaxed);
}

void CompletionHooks::setInfoHook(InfoHook hook) {
  TORCH_CHECK(hook != nullptr, "tunedist: register_on_completion_hook on rank ", rank_, ": the hook is empty");
  std::lock_guard<std::mutex> lock(mutex_);
  // As ProcessGroupNCCL: one hook per group, for the group's lifetime.
  TORCH_CHECK(info_ == nullptr, "tunedist: register_on_completion_hook on rank ", rank_,
              ": this process group already has an on-completion hook");
  TORCH_CHECK(!stop_, "tunedist: register_on_completion_hook on rank ", rank_,
              ": the process group was shut down or aborted");
  info_ = std::move(hook);
  infoThread_ = std::thread([self = shared_from_this()] { self->infoLoop(); });
  refreshActiveLocked();
}

void CompletionHooks::addKeyed(int64_t id, std::function<void(uint64_t, std::optional<float>)> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(keyed_.count(id) == 0, "tunedist: registerCompletionHook on rank ", rank_, ": hook id ", id,
              " is registered already");
  keyed_.emplace(id, std::move(hook));
  refreshActiveLocked();
}

void CompletionHooks::removeKeyed(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  keyed_.erase(id);
  refreshActiveLocked();
}

void CompletionHooks::report(const Record& record) {
  if (record.issued == Clock::time_point{}) {
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (!keyed_.empty()) {
    const float ms = std::chrono::duration<float, std::milli>(record.finished - record.started).count();
    // Under the lock, on this thread: the Work is alive, so its key (its address) names it and no other.
    for (auto& [id, hook] : keyed_) {
      try {
        hook(record.completionKey, ms);
      } catch (const std::exception& e) {
        TORCH_WARN("tunedist: a completion hook (id ", id, ") on rank ", rank_, " failed: ", e.what());
      }
    }
  }
  if (info_ != nullptr && !stop_) {
    pending_.push_back(record);
    lock.unlock();
    cv_.notify_one();
  }
}

// The WorkInfo hook's thread: each reported operation in order. timeStarted is when the caller issued it (NCCL: when
// its Work was made), timeFinished when it had run, activeDuration how long it ran (NCCL: between its CUDA events).
void CompletionHooks::infoLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !pending_.empty(); });
    if (pending_.empty()) {
      return;  // stopped, and everything reported has been run
    }
    std::vector<Record> batch(pending_.begin(), pending_.end());
    pending_.clear();
    running_ = true;
    lock.unlock();
    for (const Record& r : batch) {
      try {
        info_(std::make_shared<c10d::WorkInfo>(r.type, r.seq, r.issued, r.finished,
                                               std::chrono::duration<float>(r.finished - r.started)));
      } catch (const std::exception& e) {
        TORCH_WARN("tunedist: the on-completion hook on rank ", rank_, " failed for operation ", r.seq, ": ", e.what());
      }
    }
    lock.lock();
    running_ = false;
    drained_.notify_all();
  }
}

void CompletionHooks::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!infoThread_.joinable() || infoThread_.get_id() == std::this_thread::get_id()) {
    return;
  }
  drained_.wait(lock, [this] { return stop_ || (pending_.empty() && !running_); });
}

void CompletionHooks::shutdown() {
  std::thread thread;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    refreshActiveLocked();
    thread = std::move(infoThread_);
  }
  cv_.notify_all();
  drained_.notify_all();
  if (thread.joinable()) {
    if (thread.get_id() == std::this_thread::get_id()) {
      thread.detach();  // the hook itself dropped the last reference to the group
    } else {
      thread.join();
    }
  }
}

}  // namespace tunedist::cpu
