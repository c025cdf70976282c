// The engine's Rendezvous over a c10d::Store (the group's PrefixStore, so keys never collide across groups).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/rendezvous.h"

namespace tunedist::cpu {

class StoreRendezvous : public core::Rendezvous {
 public:
  explicit StoreRendezvous(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }

  // Polls with check() instead of a blocking store wait: a TCPStore client serialises every call of a process, so
  // one thread's blocking wait would hold up another group's set() on the same store and ranks could wait on each
  // other in a cycle.
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::microseconds(200);
    while (!check(key)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        throw tunedist::core::TimeoutError("tunedist: Timed out after " + std::to_string(timeout.count()) +
                                           " ms waiting for key '" + key + "' to appear in the process group's store");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(20000));
    }
    std::vector<uint8_t> v = store_->get(key);
    return std::string(v.begin(), v.end());
  }

  // Throws once the group was aborted: every wait on the store (finding the hosts, a segment's name) polls it.
  bool check(const std::string& key) override {
    if (aborted_.load(std::memory_order_relaxed)) {
      throw tunedist::core::Error("tunedist: the process group was aborted while it waited for key '" + key +
                                  "' in its store");
    }
    return store_->check({key});
  }

  // Makes every wait on this rendezvous, now and later, throw.
  void abort() { aborted_.store(true, std::memory_order_relaxed); }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  std::atomic<bool> aborted_{false};
};

}  // namespace tunedist::cpu
