// CpuBackend: construction, launching collectives on the executor, coalescing, timeouts, abort and shutdown. The
// collectives themselves live in this folder, one file each; the engines are made in engines.cpp.
#include "backend/cpu/cpu_backend.h"

#include <c10/util/Exception.h>

#include <utility>

#include "backend/cpu/store_rendezvous.h"
#include "backend/engine/hier/p2p.h"
#include "shm/p2p/engine.h"
#include "topology/host_discovery.h"

namespace tunedist::cpu {

CpuBackend::CpuBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Options options)
    : c10d::Backend(rank, size), store_(store), options_(std::move(options)) {
  TORCH_CHECK(store_, "tunedist: TunedBackend on rank ", rank, " needs a store");
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "tunedist: invalid rank ", rank, " for a group of ", size);
  rendezvous_ = std::make_shared<StoreRendezvous>(store_);
  heap_ = std::make_shared<shm::SymmetricHeap>(shm::HeapOptions::from(options_.shm),
                                               c10::str("rank ", rank, " of ", size));
  // One store write, no waiting: the engines are made at the first operation, once every rank's key is in.
  discovery_ = std::make_unique<topology::HostDiscovery>(rendezvous_, rank, size, options_.shm);
  discovery_->publish(topology::HostKey{topology::hostLabelFromEnv(),
                                        topology::shareableMemoryFingerprint(options_.shm.shmDir)});
  Executor::Options executorOptions = options_.executor;
  executorOptions.inlineAsync = executorOptions.inlineAsync || size == 1;
  executor_ = Executor::start(rank, executorOptions, [this](const core::OpContext& ctx) { prepareCollective(ctx); });
}

CpuBackend::~CpuBackend() { shutdown(); }

std::chrono::milliseconds CpuBackend::effectiveTimeout(std::chrono::milliseconds requested) const {
  const bool ephemeral = hasEphemeral_.load(std::memory_order_relaxed);
  if (requested.count() > 0 && !ephemeral) {
    return requested;
  }
  std::lock_guard<std::mutex> lock(optionsMutex_);
  const std::chrono::milliseconds base = requested.count() > 0 ? requested : options_.timeout;
  return ephemeral ? base + ephemeralLocked() : base;
}

void CpuBackend::setTimeout(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(optionsMutex_);
  options_.timeout = timeout;
}

CpuBackend::Options CpuBackend::options() const {
  std::lock_guard<std::mutex> lock(optionsMutex_);
  return options_;
}

void CpuBackend::rejectCall(const char* op, const std::string& message) {
  std::string full = c10::str("tunedist: ", op, ": rank ", rank_, " of ", size_, ": ", message);
  // Peers may already be waiting for this rank inside the same operation: fail the group so they stop too.
  try {
    hostLayout(std::chrono::steady_clock::now() + effectiveTimeout(c10d::kUnsetTimeout));
  } catch (const std::exception&) {
    // Without the layout there are no engines to fail; the peers then time out finding the hosts.
  }
  abortEngines(full);
  TORCH_CHECK(false, full);
}

c10::intrusive_ptr<c10d::Work> CpuBackend::endCoalescing() {
  return executor_->endCoalescing(effectiveTimeout(c10d::kUnsetTimeout));
}

engine::CrossHostStats CpuBackend::crossHostStats() const {
  return layoutReady_.load(std::memory_order_acquire) ? engine_->crossHostStats() : engine::CrossHostStats{};
}

void CpuBackend::abort() {
  // Waits on the store (the first operation finding its hosts) stop too.
  rendezvous_->abort();
  abortEngines(c10::str("tunedist: rank ", rank_, " aborted the process group"));
  shutdown();
}

void CpuBackend::shutdown() {
  executor_->shutdown();
  // No peer maps this rank's heap chunks after the group ends, though tensors from them may live on: drop the names.
  heap_->makePrivate();
}

bool CpuBackend::isShutDown() { return executor_->stopped(); }

}  // namespace tunedist::cpu
