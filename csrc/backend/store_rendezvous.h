// The engine's Rendezvous over a c10d::Store (the group's PrefixStore, so keys never collide across groups).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>
#include <vector>

#include "shm/comm.h"
#include "shm/error.h"

namespace tunedist {

class StoreRendezvous : public shm::Rendezvous {
 public:
  explicit StoreRendezvous(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    try {
      store_->wait({key}, std::max(timeout, std::chrono::milliseconds(1)));
    } catch (const std::exception& e) {
      throw tunedist::TimeoutError(std::string("tunedist: waiting for key '") + key +
                                   "' in the process group's store failed: " + e.what());
    }
    std::vector<uint8_t> v = store_->get(key);
    return std::string(v.begin(), v.end());
  }

  bool check(const std::string& key) override { return store_->check({key}); }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace tunedist
