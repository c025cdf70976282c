// Heartbeat: a small thread that holds our life lock (core/sync.h) in every ring this process has mapped, so peers
// learn of this process's death exactly, and bumps our heartbeat counter there, the last resort where a lock cannot
// tell. A thread of its own, so a long Done callback on the progress thread never makes peers think this process
// died.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shm/p2p/ring.h"

namespace tunedist::shm::p2p {

class Heartbeat {
 public:
  explicit Heartbeat(std::chrono::milliseconds period) : period_(period) {}
  ~Heartbeat() { stop(); }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  void start();
  // Stops and joins the thread; start() may run it again.
  void stop();
  // Beats once in `ring` now and with every period from now on. The ring must outlive the thread.
  void add(P2pRing& ring);
  // Initialises `lock` and has the thread hold it until stop(); returns once it is held. The thread must run.
  void hold(core::LifeLock* lock);

 private:
  void loop();
  void takeLocks(std::unique_lock<std::mutex>& guard);

  const std::chrono::milliseconds period_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<std::atomic<uint64_t>*> beats_;
  std::vector<core::LifeLock*> toHold_;  // handed over by hold(), taken by the thread
  std::vector<core::LifeLock*> held_;    // the thread's only
  std::string holdError_;                // why the thread could not hold the last lock handed over
  std::thread thread_;
};

}  // namespace tunedist::shm::p2p
