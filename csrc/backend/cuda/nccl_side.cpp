// NcclSide: creation of the wrapped CUDA backend (through the factory, else createNcclBackend) and the calls
// forwarded to it as a whole group (timeouts, name, abort, shutdown).
#include "backend/cuda/nccl_side.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <utility>

namespace tunedist::cuda {

#ifndef TUNEDIST_WITH_NCCL
// A CPU-only build (TUNEDIST_USE_NCCL=OFF): nccl_factory.cpp is not compiled. Without a factory NcclSide::get
// refuses first; a factory that leaves the choice to C++ gets the same refusal here.
NcclBuildInfo ncclBuildInfo() { return NcclBuildInfo{}; }

c10::intrusive_ptr<c10d::Backend> createNcclBackend(const NcclSide::CreateArgs&) {
  TORCH_CHECK(false,
              "this tunedist build has no NCCL support of its own, and the factory of the CUDA side made no "
              "backend; use init_process_group(\"cpu:tuned,cuda:nccl\")");
}
#endif

NcclSide::NcclSide(c10::intrusive_ptr<c10d::Store> store, int rank, int size, Options options)
    : store_(std::move(store)), rank_(rank), size_(size), options_(std::move(options)) {}

c10d::Backend& NcclSide::get(const std::optional<at::Device>& device, const std::string& groupDesc) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // After abort()/shutdown() every CUDA call fails here, with the same words as the CPU side's.
    TORCH_CHECK(!closed_, "the process group was shut down or aborted");
    if (backend_) {
      return *backend_;
    }
  }
  std::lock_guard<std::mutex> creating(createMutex_);
  CreateArgs args;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!closed_, "the process group was shut down or aborted");
    if (backend_) {
      return *backend_;  // another thread made it while this one waited
    }
    TORCH_CHECK(available(),
                "CUDA needs the group's NCCL side, but this tunedist build has no NCCL support (it was built with "
                "TUNEDIST_USE_NCCL=OFF, or without a CUDA build of torch). Map CUDA to torch's NCCL backend: "
                "init_process_group(\"cpu:tuned,cuda:nccl\"), or rebuild tunedist against a CUDA build of torch "
                "with TUNEDIST_USE_NCCL=ON.");
    args.store = c10::make_intrusive<c10d::PrefixStore>(options_.storePrefix, store_);
    args.rank = rank_;
    args.size = size_;
    args.timeout = options_.timeout;
    args.groupUid = groupUid_;
    if (device.has_value() && device->is_cuda() && device->has_index()) {
      args.device = device;
    }
  }
  // Outside mutex_: the factory runs Python (it takes the GIL), and a thread that holds the GIL may be waiting for
  // mutex_ in existing().
  c10::intrusive_ptr<c10d::Backend> made = options_.factory ? options_.factory(args) : nullptr;
  if (!made) {
    made = createNcclBackend(args);
  }
  TORCH_INTERNAL_ASSERT(made, "tunedist: the CUDA side's factory returned no backend");
  made->setGroupDesc(groupDesc);
  std::vector<std::function<void(c10d::Backend&)>> configure;
  CreatedHook announce;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) {
      made->shutdown();  // aborted or shut down while it was being made: nobody may use it
      TORCH_CHECK(false, "the process group was shut down or aborted");
    }
    backend_ = made;
    configure.swap(pendingConfigure_);
    announce = options_.onCreated;
  }
  for (auto& fn : configure) {
    fn(*made);
  }
  if (announce) {
    announce(rank_, size_);
  }
  return *made;
}

c10::intrusive_ptr<c10d::Backend> NcclSide::existing() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return backend_;
}

void NcclSide::adopt(c10::intrusive_ptr<c10d::Backend> backend) {
  std::vector<std::function<void(c10d::Backend&)>> configure;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_INTERNAL_ASSERT(!backend_ && !closed_, "tunedist: NcclSide::adopt on a side that has a backend");
    backend_ = backend;
    configure.swap(pendingConfigure_);
  }
  for (auto& fn : configure) {
    fn(*backend);
  }
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
