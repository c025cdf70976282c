// OpContext: what one call of a collective or point-to-point operation is called in messages, its sequence number and
// its deadline. Made by the CPU side's executor for each operation, read by every engine below it.
#pragma once

#include <chrono>
#include <cstdint>

namespace tunedist::core {

struct OpContext {
  const char* name;
  uint64_t seq;
  std::chrono::steady_clock::time_point deadline;
};

}  // namespace tunedist::core
