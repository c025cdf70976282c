// OneHostP2p: the HostP2p of a group whose ranks all share this host, over the shared-memory rings of
// shm::p2p::P2pEngine. Its ranks are the group's.
#pragma once

#include <memory>

#include "backend/engine/host_p2p.h"
#include "shm/p2p/engine.h"

namespace tunedist::engine {

class OneHostP2p final : public HostP2p {
 public:
  explicit OneHostP2p(std::unique_ptr<shm::p2p::P2pEngine> engine) : engine_(std::move(engine)) {}

  void isend(int dst, int tag, const at::Tensor& data, Clock::time_point deadline, Done done) override;
  void irecv(int src, int tag, const at::Tensor& data, Clock::time_point deadline, Done done) override;
  void abort(const std::string& reason) override { engine_->abort(reason); }

 private:
  std::unique_ptr<shm::p2p::P2pEngine> engine_;
};

}  // namespace tunedist::engine
