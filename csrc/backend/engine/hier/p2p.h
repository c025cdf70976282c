// CrossHostP2p: send/recv between ranks on different hosts, over a gloo group of the two ranks (kind "p2p",
// created by whichever of them first talks to the other).
//
// Each message is a 16-byte header (payload bytes, dtype) followed by the payload, both on the caller's tag, so
// the receiver knows the size before gloo sees the payload (gloo aborts the process on a size mismatch): a
// mismatch drains the payload into scratch memory and fails the receive with both sizes, never the process.
// Per peer, three ordered lanes (threads) keep the semantics of isend/irecv: one posts sends (gloo sends are
// asynchronous), one waits for them in order and completes their Works, one runs receives in order. So no call
// blocks its caller, a receive never holds up a send, and the pair's gloo group is created off the caller's
// thread (two ranks that each send first and then receive cannot deadlock on it).
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>

#include "backend/engine/hier/cross_host.h"
#include "shm/p2p/engine.h"

namespace tunedist::engine::hier {

class CrossHostP2p {
 public:
  using Done = shm::p2p::P2pEngine::Done;
  using Clock = std::chrono::steady_clock;

  // Tasks hold `x`: a lane detached at shutdown may still finish with it.
  explicit CrossHostP2p(std::shared_ptr<CrossHost> x) : x_(std::move(x)) {}
  ~CrossHostP2p();

  // `data` is contiguous and stays referenced until `done` has run.
  void isend(int dst, int tag, const at::Tensor& data, Clock::time_point deadline, Done done);
  void irecv(int src, int tag, const at::Tensor& data, Clock::time_point deadline, Done done);

 private:
  class Lane;
  struct Peer {
    std::shared_ptr<Lane> posts;
    std::shared_ptr<Lane> sendWaits;
    std::shared_ptr<Lane> recvs;
  };
  Peer& peer(int rank);

  std::shared_ptr<CrossHost> x_;
  std::mutex mutex_;
  std::map<int, Peer> peers_;
};

}  // namespace tunedist::engine::hier
