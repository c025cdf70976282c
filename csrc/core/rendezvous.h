// Rendezvous: the key-value exchange the engine uses to set up a group (segment names, host keys, abort reasons):
// c10d::Store in the backend (backend/cpu/store_rendezvous.h), an in-memory map in the engine's tests. Every key the
// project writes is named in core/store_keys.h.
#pragma once

#include <chrono>
#include <string>

namespace tunedist::core {

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until `key` exists or `timeout` passes (then throws tunedist::core::TimeoutError).
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // True if `key` exists now; never blocks.
  virtual bool check(const std::string& key) = 0;
};

}  // namespace tunedist::core
