// HostP2p: the engine interface of the CPU side's send and recv, beside HostCollectives. Ranks are the group's; each
// call only queues the transfer, and `done` runs once on an engine thread when it has finished.
//
// Implementations, chosen once with the collectives' engine (cpu::CpuBackend::makeEngines):
//   OneHostP2p (engine/one_host_p2p.h)  every rank on this host: shared-memory rings (shm::p2p::P2pEngine).
//   HierP2p    (engine/hier/hier_p2p.h) several hosts: the rings for peers on this host, gloo pairs for the others.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <exception>
#include <functional>
#include <string>

namespace tunedist::engine {

class HostP2p {
 public:
  // error is null on success; peer is the group rank the message came from (receives) or went to (sends).
  using Done = std::function<void(std::exception_ptr error, int peer)>;
  using Clock = std::chrono::steady_clock;

  virtual ~HostP2p() = default;
  // `data` is contiguous and stays referenced until `done` has run.
  virtual void isend(int dst, int tag, const at::Tensor& data, Clock::time_point deadline, Done done) = 0;
  // Receives exactly data's bytes from `src` (-1: any source, where the implementation allows it; else it throws).
  virtual void irecv(int src, int tag, const at::Tensor& data, Clock::time_point deadline, Done done) = 0;
  // Fails every pending and future transfer with `reason`.
  virtual void abort(const std::string& reason) = 0;
};

}  // namespace tunedist::engine
