// Heartbeat: a small thread that bumps our heartbeat counter in every ring this process has mapped, so peers can
// tell that it lives. A thread of its own, so a long Done callback on the progress thread never makes peers think
// this process died.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
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

 private:
  void loop();

  const std::chrono::milliseconds period_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<std::atomic<uint64_t>*> beats_;
  std::thread thread_;
};

}  // namespace tunedist::shm::p2p
