#include "shm/p2p/heartbeat.h"

#include "core/error.h"

namespace tunedist::shm::p2p {

void Heartbeat::start() {
  stop_ = false;
  thread_ = std::thread([this] { loop(); });
}

void Heartbeat::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    takeLocks(lock);
    for (std::atomic<uint64_t>* beat : beats_) {
      // Release: a peer that sees the new count knows this process was alive a moment ago.
      beat->fetch_add(1, std::memory_order_release);
    }
    cv_.wait_for(lock, period_, [this] { return stop_ || !toHold_.empty(); });
  }
  // Leaving: every lock we hold becomes free, as at our death; the rings are closed first, so peers see "closed".
  for (core::LifeLock* l : held_) {
    core::releaseLifeLock(l);
  }
  held_.clear();
}

// Called by the thread with `guard` held: holds what hold() handed over and wakes the callers. The life locks are
// taken with mutex_ released, so every lock-order checker sees one order only (a life lock, then mutex_).
void Heartbeat::takeLocks(std::unique_lock<std::mutex>& guard) {
  if (toHold_.empty()) {
    return;
  }
  const std::vector<core::LifeLock*> taking = toHold_;
  std::vector<core::LifeLock*> took;
  std::string error;
  guard.unlock();
  for (core::LifeLock* l : taking) {
    try {
      core::holdLifeLock(l);
      took.push_back(l);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  guard.lock();
  held_.insert(held_.end(), took.begin(), took.end());
  if (!error.empty()) {
    holdError_ = error;
  }
  // hold() may have appended more meanwhile: those wait for the next turn.
  toHold_.erase(toHold_.begin(), toHold_.begin() + std::ptrdiff_t(taking.size()));
  cv_.notify_all();
}

void Heartbeat::hold(core::LifeLock* lock) {
  core::initLifeLock(lock);
  std::unique_lock<std::mutex> guard(mutex_);
  TD_CHECK(thread_.joinable() && !stop_, "tunedist: internal error: a p2p life lock handed to a stopped heartbeat");
  toHold_.push_back(lock);
  cv_.notify_all();
  cv_.wait(guard, [&] { return toHold_.empty() || stop_; });
  TD_CHECK(holdError_.empty() && !stop_, "tunedist: ", holdError_.empty() ? "the heartbeat stopped" : holdError_);
}

void Heartbeat::add(P2pRing& ring) {
  std::lock_guard<std::mutex> lock(mutex_);
  ring.ownBeat().fetch_add(1, std::memory_order_release);
  beats_.push_back(&ring.ownBeat());
}

void Heartbeat::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  }
}

}  // namespace tunedist::shm::p2p
