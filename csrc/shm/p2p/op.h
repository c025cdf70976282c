// One point-to-point operation on its way through the engine, how it is named in error messages, and how it ends:
// complete() or fail() run its Done callback, on the progress thread and never under a lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

#include "shm/p2p/engine.h"

namespace tunedist::shm::p2p {

using Clock = P2pEngine::Clock;

struct Op {
  bool isSend = false;
  int peer = -1;  // dst for a send, src for a receive (-1: any source)
  int tag = 0;
  char* data = nullptr;
  size_t bytes = 0;
  Clock::time_point posted;
  Clock::time_point deadline;
  P2pEngine::Done done;
  // Sends: span bytes (header + padded payload) already in the ring; 0 until the op starts.
  uint64_t written = 0;
};
using OpPtr = std::unique_ptr<Op>;

// The error of a failed operation. The exception object's temporary dies in here, before Done runs: a copy freed on
// this thread after Done handed the error on would race (for ThreadSanitizer) with the reader of what().
template <typename E>
std::exception_ptr errorOf(const std::string& message) {
  return std::make_exception_ptr(E(message));
}

// "send to rank 1 (tag 7, 64 bytes) on rank 0", "recv from any source (tag 7, 64 bytes) on rank 0".
std::string describe(const Op& op, int rank);
// `op` posted to a channel that failed earlier with `failure` (quoted as it was recorded).
std::exception_ptr channelError(const Op& op, int rank, const std::string& failure, bool dead);
// `op` failed because of `why` (PeerDeadError when `dead`).
std::exception_ptr opError(const Op& op, int rank, const std::string& why, bool dead);
// `op` passed its deadline; `why` says what it was waiting for.
std::exception_ptr timeoutError(const Op& op, int rank, const std::string& why);

// Runs Done with success (`srcRank`: where the message came from, or the destination of a send).
void complete(OpPtr op, int srcRank);
// Runs Done with `error`.
void fail(OpPtr op, std::exception_ptr error);

}  // namespace tunedist::shm::p2p
