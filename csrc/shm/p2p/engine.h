// P2pEngine: point-to-point send/recv between ranks of one host, through one shared-memory ring per ordered pair
// of ranks. Not collective: a pair's ring is created lazily by the sender at the pair's first message and found
// by the receiver through the rendezvous, so ranks outside the pair are never involved.
//
// Semantics (those of c10d/gloo): messages from one source to one destination are matched to receives in order
// among those with the same tag; a receive from any source (src == -1) takes the first matching message of any
// source. A send completes once its bytes are out of the caller's buffer. Sizes must match exactly: a mismatch
// fails the receive with an error naming both sizes, tag and ranks.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "core/options.h"
#include "core/rendezvous.h"

namespace tunedist::shm::p2p {

class P2pEngine {
 public:
  // Called once, on the engine's progress thread, when the operation finished: error is null on success; srcRank
  // is the rank the message came from (receives) or the destination (sends).
  using Done = std::function<void(std::exception_ptr error, int srcRank)>;
  using Clock = std::chrono::steady_clock;

  P2pEngine(std::shared_ptr<core::Rendezvous> rendezvous, int rank, int size, core::ShmOptions options);
  // Stops the progress thread; operations still pending complete with an error.
  ~P2pEngine();
  P2pEngine(const P2pEngine&) = delete;
  P2pEngine& operator=(const P2pEngine&) = delete;

  // Queues a send of `bytes` from `data` to rank `dst` with `tag`. `data` must stay valid until `done` runs.
  void isend(int dst, int tag, const void* data, size_t bytes, Clock::time_point deadline, Done done);
  // Queues a receive of exactly `bytes` into `data` from rank `src` (-1: any source) with `tag`.
  void irecv(int src, int tag, void* data, size_t bytes, Clock::time_point deadline, Done done);
  // Fails every pending and future operation with `reason`.
  void abort(const std::string& reason);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tunedist::shm::p2p
