// CpuBackend: finding the group's hosts and making its engines (see cpu_backend.h, "Hosts").
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/store_rendezvous.h"
#include "backend/engine/hier/hier_host.h"
#include "backend/engine/hier/hier_p2p.h"
#include "backend/engine/one_host_p2p.h"
#include "backend/engine/symmetric_host.h"
#include "core/store_keys.h"
#include "shm/layout.h"
#include "shm/p2p/engine.h"
#include "topology/host_discovery.h"

namespace tunedist::cpu {

const topology::HostLayout& CpuBackend::hostLayout(std::chrono::steady_clock::time_point deadline) {
  if (layoutReady_.load(std::memory_order_acquire)) {
    return *layout_;
  }
  std::lock_guard<std::mutex> lock(topoMutex_);
  if (!layoutReady_.load(std::memory_order_relaxed)) {
    topology::HostLayout layout = discovery_->proposeLayout(deadline);
    makeEngines(layout);
    layout_ = std::move(layout);
    layoutReady_.store(true, std::memory_order_release);
    if (!pendingAbort_.empty()) {
      engine_->abort(pendingAbort_);
      p2p_->abort(pendingAbort_);
    }
  }
  return *layout_;
}

// The one place that chooses the engine: SymmetricHost (zero-copy on symmetric buffers, OneHost's copying
// algorithms otherwise) when every rank shares this host, HierHost otherwise.
void CpuBackend::makeEngines(const topology::HostLayout& layout) {
  const Options options = this->options();
  if (layout.oneHost()) {
    // Every rank, the group's own store keys.
    engine_ = std::make_unique<engine::SymmetricHost>(std::make_unique<shm::ShmComm>(rendezvous_, rank_, size_,
                                                                                     options.shm, heap_));
    p2p_ = std::make_unique<engine::OneHostP2p>(std::make_unique<shm::p2p::P2pEngine>(rendezvous_, rank_, size_,
                                                                                      options.shm));
    return;
  }
  // Several hosts: collectives copy, so nobody maps this rank's heap chunks; their names can go now.
  heap_->makePrivate();
  const int host = layout.hostOf[size_t(rank_)];
  const int local = layout.localRankOf[size_t(rank_)];
  const int localSize = int(layout.hosts[size_t(host)].size());
  auto hostStore = c10::make_intrusive<c10d::PrefixStore>(core::keys::hostPrefix(host), store_);
  auto hostRendezvous = std::make_shared<StoreRendezvous>(hostStore);
  auto cross = std::make_shared<engine::hier::CrossHost>(store_, rank_, layout, options.glooFactory, options.timeout);
  engine_ = std::make_unique<engine::hier::HierHost>(
      cross, std::make_unique<shm::ShmComm>(hostRendezvous, local, localSize, options.shm), options.crossHost);
  p2p_ = std::make_unique<engine::hier::HierP2p>(rank_, std::move(cross),
                                                 std::make_unique<shm::p2p::P2pEngine>(hostRendezvous, local, localSize,
                                                                                       options.shm));
}

void CpuBackend::prepareCollective(const core::OpContext& ctx) {
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

void CpuBackend::abortEngines(const std::string& reason) {
  std::lock_guard<std::mutex> lock(topoMutex_);
  if (!layoutReady_.load()) {
    if (pendingAbort_.empty()) {
      pendingAbort_ = reason;
    }
    return;
  }
  engine_->abort(reason);
  p2p_->abort(reason);
}

size_t CpuBackend::reservedShmBytes() const {
  if (layoutReady_.load(std::memory_order_acquire)) {
    return engine_->reservedShmBytes();
  }
  return shm::SegmentGeometry(size_, options_.shm.slotBytes).totalBytes;
}

const shm::ShmComm* CpuBackend::hostComm() const {
  return layoutReady_.load(std::memory_order_acquire) ? &engine_->hostComm() : nullptr;
}

engine::HostP2p& CpuBackend::p2pEngine() {
  hostLayout(std::chrono::steady_clock::now() + effectiveTimeout(c10d::kUnsetTimeout));
  return *p2p_;
}

}  // namespace tunedist::cpu
