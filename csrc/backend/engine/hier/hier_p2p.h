// HierP2p: the HostP2p of a group that spans several hosts: shared-memory rings (shm::p2p::P2pEngine over this host's
// ranks) for a peer on this host, CrossHostP2p (gloo pairs, made at the first transfer with another host) for the
// others. A receive must name its source: which engine would deliver it depends on the sender's host.
#pragma once

#include <memory>
#include <mutex>

#include "backend/engine/hier/cross_host.h"
#include "backend/engine/hier/p2p.h"
#include "backend/engine/host_p2p.h"
#include "shm/p2p/engine.h"

namespace tunedist::engine::hier {

class HierP2p final : public HostP2p {
 public:
  // `local` runs over this host's ranks (their positions on it, topology::HostLayout::localRankOf); `cross` is the
  // group's link between hosts, with the layout.
  HierP2p(int rank, std::shared_ptr<CrossHost> cross, std::unique_ptr<shm::p2p::P2pEngine> local);

  void isend(int dst, int tag, const at::Tensor& data, Clock::time_point deadline, Done done) override;
  void irecv(int src, int tag, const at::Tensor& data, Clock::time_point deadline, Done done) override;
  void abort(const std::string& reason) override { local_->abort(reason); }

 private:
  // The P2pEngine's rank for group rank `peer` (its position on this host), or -1 for a peer on another host.
  int localPeer(int peer) const;
  // The local engine reports positions on this host: the group rank of `done`'s peer instead.
  Done groupRanked(Done done) const;
  CrossHostP2p& cross();

  const int rank_;
  std::shared_ptr<CrossHost> crossHost_;
  std::unique_ptr<shm::p2p::P2pEngine> local_;
  std::mutex mutex_;
  std::unique_ptr<CrossHostP2p> cross_;  // under mutex_
};

}  // namespace tunedist::engine::hier
