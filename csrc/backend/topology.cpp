// TunedBackend: finding the group's hosts and making its engines (see backend.h, "Hosts").
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "backend/backend.h"
#include "backend/store_rendezvous.h"
#include "core/store_keys.h"
#include "shm/layout.h"

namespace tunedist {

const shm::HostLayout& TunedBackend::hostLayout(std::chrono::steady_clock::time_point deadline) {
  if (layoutReady_.load(std::memory_order_acquire)) {
    return *layout_;
  }
  std::lock_guard<std::mutex> lock(topoMutex_);
  if (!layoutReady_.load(std::memory_order_relaxed)) {
    shm::HostLayout layout = discovery_->proposeLayout(deadline);
    makeEngines(layout);
    layout_ = std::move(layout);
    layoutReady_.store(true, std::memory_order_release);
    if (!pendingAbort_.empty()) {
      comm_->abort(pendingAbort_);
      p2p_->abort(pendingAbort_);
      if (cross_) {
        cross_->fail(pendingAbort_);
      }
    }
  }
  return *layout_;
}

void TunedBackend::makeEngines(const shm::HostLayout& layout) {
  if (layout.oneHost()) {
    // Exactly the one-host engines of before: every rank, the group's own store keys.
    comm_ = std::make_unique<shm::ShmComm>(rendezvous_, rank_, size_, options_.shm);
    p2p_ = std::make_unique<shm::P2pEngine>(rendezvous_, rank_, size_, options_.shm);
    return;
  }
  const int host = layout.hostOf[size_t(rank_)];
  const int local = layout.localRankOf[size_t(rank_)];
  const int localSize = int(layout.hosts[size_t(host)].size());
  auto hostStore = c10::make_intrusive<c10d::PrefixStore>(keys::hostPrefix(host), store_);
  auto hostRendezvous = std::make_shared<StoreRendezvous>(hostStore);
  comm_ = std::make_unique<shm::ShmComm>(hostRendezvous, local, localSize, options_.shm);
  p2p_ = std::make_unique<shm::P2pEngine>(hostRendezvous, local, localSize, options_.shm);
  cross_ = std::make_shared<CrossHost>(store_, rank_, layout, options_.glooFactory, options_.timeout);
}

void TunedBackend::prepareCollective(const shm::OpContext& ctx) {
  if (verified_) {
    return;
  }
  TORCH_CHECK(verifyError_.empty(), verifyError_);
  const auto& layout = hostLayout(ctx.deadline);
  if (layout.oneHost()) {
    // The group's own segment is the probe: rank 0 creates it (O_EXCL, 0600, 128 random bits in its name) and
    // every other rank must open it to attach, or fail with a clear error that reaches every rank. A separate
    // probe would add a round trip to every group's first collective and make rank 0 wait for its peers first.
    verified_ = true;
    return;
  }
  try {
    discovery_->verify(layout, ctx.deadline);
  } catch (const std::exception& e) {
    verifyError_ = c10::str("tunedist: ", ctx.name, " (seq ", ctx.seq, ") on rank ", rank_, " of ", size_, ": ",
                            e.what());
    TORCH_CHECK(false, verifyError_);
  }
  verified_ = true;
}

void TunedBackend::abortEngines(const std::string& reason) {
  std::lock_guard<std::mutex> lock(topoMutex_);
  if (!layoutReady_.load()) {
    if (pendingAbort_.empty()) {
      pendingAbort_ = reason;
    }
    return;
  }
  comm_->abort(reason);
  p2p_->abort(reason);
  if (cross_) {
    cross_->fail(reason);
  }
}

size_t TunedBackend::reservedShmBytes() const {
  if (layoutReady_.load(std::memory_order_acquire)) {
    return comm_->reservedBytes();
  }
  return shm::SegmentGeometry(size_, options_.shm.slotBytes).totalBytes;
}

int TunedBackend::localPeer(int peer) const {
  const auto& layout = *layout_;
  return layout.hostOf[size_t(peer)] == layout.hostOf[size_t(rank_)] ? layout.localRankOf[size_t(peer)] : -1;
}

int TunedBackend::groupRankOnHost(int local) const {
  const auto& layout = *layout_;
  return layout.rankAt(layout.hostOf[size_t(rank_)], local);
}

hier::CrossHostP2p& TunedBackend::crossP2p() {
  std::lock_guard<std::mutex> lock(topoMutex_);
  TORCH_INTERNAL_ASSERT(cross_ != nullptr);
  if (!crossP2p_) {
    crossP2p_ = std::make_unique<hier::CrossHostP2p>(cross_);
  }
  return *crossP2p_;
}

void TunedBackend::runHier(const shm::OpContext& ctx, const std::function<void()>& body) {
  runCrossHost(*cross_, ctx, [this](const std::string& why) { comm_->abort(why); }, body);
}

}  // namespace tunedist
