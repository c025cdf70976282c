#include "backend/engine/hier/hier_p2p.h"

#include <c10/util/Exception.h>

#include "backend/engine/tensors.h"

namespace tunedist::engine::hier {

HierP2p::HierP2p(int rank, std::shared_ptr<CrossHost> cross, std::unique_ptr<shm::p2p::P2pEngine> local)
    : rank_(rank), crossHost_(std::move(cross)), local_(std::move(local)) {}

int HierP2p::localPeer(int peer) const {
  const topology::HostLayout& layout = crossHost_->layout();
  return layout.hostOf[size_t(peer)] == layout.hostOf[size_t(rank_)] ? layout.localRankOf[size_t(peer)] : -1;
}

HostP2p::Done HierP2p::groupRanked(Done done) const {
  return [layout = &crossHost_->layout(), host = crossHost_->layout().hostOf[size_t(rank_)],
          done = std::move(done)](std::exception_ptr error, int peer) {
    done(std::move(error), peer < 0 ? peer : layout->rankAt(host, peer));
  };
}

CrossHostP2p& HierP2p::cross() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!cross_) {
    cross_ = std::make_unique<CrossHostP2p>(crossHost_);
  }
  return *cross_;
}

void HierP2p::isend(int dst, int tag, const at::Tensor& data, Clock::time_point deadline, Done done) {
  const int local = localPeer(dst);
  if (local < 0) {
    cross().isend(dst, tag, data, deadline, std::move(done));
    return;
  }
  local_->isend(local, tag, data.data_ptr(), tensorBytes(data), deadline, std::move(done));
}

void HierP2p::irecv(int src, int tag, const at::Tensor& data, Clock::time_point deadline, Done done) {
  TORCH_CHECK(src >= 0, "tunedist: recv from any source on rank ", rank_,
              ": this group spans several hosts, where a receive must name its source rank");
  const int local = localPeer(src);
  if (local < 0) {
    cross().irecv(src, tag, data, deadline, std::move(done));
    return;
  }
  local_->irecv(local, tag, data.data_ptr(), tensorBytes(data), deadline, groupRanked(std::move(done)));
}

}  // namespace tunedist::engine::hier
