// NcclSide: lazy creation of the wrapped ProcessGroupNCCL and the calls forwarded to it.
#include "backend/cuda/nccl_side.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

namespace tunedist::cuda {

#ifndef TUNEDIST_WITH_NCCL
// A CPU-only build (TUNEDIST_USE_NCCL=OFF): nccl_factory.cpp is not compiled, and NcclSide::get refuses first.
NcclBuildInfo ncclBuildInfo() { return NcclBuildInfo{}; }

c10::intrusive_ptr<c10d::Backend> createNcclBackend(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                    std::chrono::milliseconds, const std::string&,
                                                    const std::optional<at::Device>&) {
  TORCH_INTERNAL_ASSERT(false, "tunedist: createNcclBackend called in a build without NCCL");
}
#endif

NcclSide::NcclSide(c10::intrusive_ptr<c10d::Store> store, int rank, int size, Options options)
    : store_(std::move(store)), rank_(rank), size_(size), options_(std::move(options)) {}

c10d::Backend& NcclSide::get(const std::optional<at::Device>& boundDevice) {
  CreatedHook announce;
  std::vector<std::function<void(c10d::Backend&)>> configure;
  c10::intrusive_ptr<c10d::Backend> backend;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // After abort()/shutdown() every CUDA call fails here, with the same words as the CPU side's.
    TORCH_CHECK(!closed_, "the process group was shut down or aborted");
    if (backend_) {
      return *backend_;
    }
    TORCH_CHECK(ncclBuildInfo().compiledIn,
                "got CUDA tensors, but this tunedist build has no NCCL support (it was built with "
                "TUNEDIST_USE_NCCL=OFF, or without a CUDA build of torch). Map CUDA to torch's NCCL backend: "
                "init_process_group(\"cpu:tuned,cuda:nccl\"), or rebuild tunedist against a CUDA build of torch "
                "with TUNEDIST_USE_NCCL=ON.");
    backend_ = createNcclBackend(c10::make_intrusive<c10d::PrefixStore>(options_.storePrefix, store_), rank_, size_,
                                 options_.timeout, groupUid_, boundDevice);
    backend = backend_;
    announce = options_.onCreated;
    configure.swap(pendingConfigure_);
  }
  for (auto& fn : configure) {
    fn(*backend);
  }
  if (announce) {
    announce(rank_, size_);
  }
  return *backend;
}

c10::intrusive_ptr<c10d::Backend> NcclSide::existing() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return backend_;
}

void NcclSide::whenCreated(std::function<void(c10d::Backend&)> configure) {
  c10::intrusive_ptr<c10d::Backend> backend;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) {
      return;
    }
    if (!backend_) {
      pendingConfigure_.push_back(std::move(configure));
      return;
    }
    backend = backend_;
  }
  configure(*backend);
}

void NcclSide::setTimeout(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  options_.timeout = timeout;
  if (backend_) {
    backend_->setTimeout(timeout);
  }
}

void NcclSide::setGroupUid(const std::string& uid) {
  std::lock_guard<std::mutex> lock(mutex_);
  groupUid_ = uid;
  if (backend_) {
    backend_->setGroupUid(uid);
  }
}

void NcclSide::rebind(c10::intrusive_ptr<c10d::Store> store, int rank, int size) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(!backend_, "tunedist: the NCCL side exists already and cannot be given new members");
  store_ = std::move(store);
  rank_ = rank;
  size_ = size;
  closed_ = false;
}

// Forwarded once: ProcessGroup::shutdown reaches this backend once per device type it serves, and the destructor
// shuts down again.
void NcclSide::abort() { close(&c10d::Backend::abort); }

void NcclSide::shutdown() { close(&c10d::Backend::shutdown); }

void NcclSide::close(void (c10d::Backend::*action)()) {
  c10::intrusive_ptr<c10d::Backend> backend;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!closed_) {
      backend = backend_;
    }
    closed_ = true;
  }
  if (backend) {
    ((*backend).*action)();
  }
}

}  // namespace tunedist::cuda
