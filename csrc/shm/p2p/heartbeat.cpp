#include "shm/p2p/heartbeat.h"

namespace tunedist::shm::p2p {

void Heartbeat::start() {
  stop_ = false;
  thread_ = std::thread([this] { loop(); });
}

void Heartbeat::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    for (std::atomic<uint64_t>* beat : beats_) {
      // Release: a peer that sees the new count knows this process was alive a moment ago.
      beat->fetch_add(1, std::memory_order_release);
    }
    cv_.wait_for(lock, period_, [this] { return stop_; });
  }
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
