// TunedBackend: the c10d calls beyond the collectives that reach its NCCL side, so that a plain `tuned` group offers
// on CUDA whatever the backend torch makes for "nccl" offers (nccl2 on torch 2.15: windows, reconfigure, keyed
// completion and abort hooks, shrink, the memory allocator, suspend/resume, time estimation).
//
// Which side a call without tensors goes to: a call only a CUDA backend can serve goes to the NCCL side, made now if
// need be (cudaSideFor); a call that could mean either (new_window() without a tensor, supportsWindow) goes to the
// bound device's side (boundCudaSide). What the group holds for both sides (hooks, timing) is handed to the NCCL side
// when it is made (NcclSide::whenCreated).
#include <c10/util/Exception.h>

#include <string>
#include <utility>
#include <vector>

#include "backend/tuned_backend.h"

namespace tunedist {

c10d::Backend& TunedBackend::cudaSideFor(const char* op) {
  try {
    return nccl_.get(getBoundDeviceId(), getGroupDesc());
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "tunedist: ", op, ": rank ", rank_, " of ", size_, ": ", e.what_without_backtrace());
  }
}

c10::intrusive_ptr<c10d::Backend> TunedBackend::boundCudaSide() const {
  const auto device = getBoundDeviceId();
  return device.has_value() && device->is_cuda() ? nccl_.existing() : nullptr;
}

// torch binds a group to init_process_group's device_id and, for a backend that can split, connects it at once. For
// a CUDA device that makes the NCCL side now, as "nccl" makes its communicator now; a CPU device needs nothing.
void TunedBackend::eagerConnectSingleDevice(at::Device device) {
  if (device.is_cuda()) {
    cudaSideFor("eager_connect_single_device").eagerConnectSingleDevice(device);
  }
}

#ifdef TUNEDIST_C10D_HAS_VIRTUAL_BOUND_DEVICE
void TunedBackend::setBoundDeviceId(std::optional<at::Device> device) {
  c10d::Backend::setBoundDeviceId(device);
  if (device.has_value() && device->is_cuda()) {
    if (auto nccl = nccl_.existing()) {
      nccl->setBoundDeviceId(device);
    }
  }
}
#endif

void TunedBackend::enableCollectivesTiming() {
  cpu_->enableCollectivesTiming();
  const int rank = rank_;
  nccl_.whenCreated([rank](c10d::Backend& nccl) {
    try {
      nccl.enableCollectivesTiming();
    } catch (const std::exception& e) {
      TORCH_WARN("tunedist: rank ", rank, ": the NCCL side (", nccl.getBackendName(),
                 ") does not time its collectives: ", e.what());
    }
  });
}

// The CPU side's hooks for what it reported; the NCCL side's where it holds an on-completion hook (torch's own test
// before it calls this on a backend).
void TunedBackend::waitForPendingWorks() {
  cpu_->waitForPendingWorks();
  if (auto nccl = nccl_.existing(); nccl && nccl->hasHooks()) {
    nccl->waitForPendingWorks();
  }
}

bool TunedBackend::supportsTimeEstimation() const {
  auto nccl = nccl_.existing();
  return nccl && nccl->supportsTimeEstimation();
}

#if defined(TUNEDIST_C10D_HAS_TIME_ESTIMATE) || defined(TUNEDIST_C10D_HAS_SUSPEND) || \
    defined(TUNEDIST_C10D_HAS_MEMORY_STATS)
namespace {

// Time estimation, suspend, resume and getMemoryStats concern the NCCL communicator (torch estimates only once it
// is up); a group that never made its NCCL side has none, and these calls do not make one.
c10d::Backend& existingSide(const c10::intrusive_ptr<c10d::Backend>& nccl, const char* op, int rank, int size) {
  TORCH_CHECK(nccl, "tunedist: ", op, ": rank ", rank, " of ", size,
              ": the group has no CUDA side yet (no CUDA call and no bound CUDA device), and ", op,
              " concerns only its NCCL communicator; the CPU side has no such state");
  return *nccl;
}

}  // namespace
#endif

#ifdef TUNEDIST_C10D_HAS_TIME_ESTIMATE
void TunedBackend::startTimeEstimate() {
  existingSide(nccl_.existing(), "start_time_estimate", rank_, size_).startTimeEstimate();
}

float TunedBackend::endTimeEstimate() {
  return existingSide(nccl_.existing(), "end_time_estimate", rank_, size_).endTimeEstimate();
}
#endif

std::shared_ptr<c10::Allocator> TunedBackend::getMemAllocator() {
  return cudaSideFor("mem_allocator").getMemAllocator();
}

#ifdef TUNEDIST_C10D_HAS_SUSPEND
void TunedBackend::suspend() { existingSide(nccl_.existing(), "suspend", rank_, size_).suspend(); }

void TunedBackend::resume() { existingSide(nccl_.existing(), "resume", rank_, size_).resume(); }
#endif

#ifdef TUNEDIST_C10D_HAS_MEMORY_STATS
std::unordered_map<std::string, uint64_t> TunedBackend::getMemoryStats() {
  return existingSide(nccl_.existing(), "get_memory_stats", rank_, size_).getMemoryStats();
}
#endif

// A CPU device (index -1) is the CPU side's symmetric heap; a CUDA device index asks the NCCL side, made now if need
// be (FSDP2 asks before the group's first collective), where this build or process can make one.
bool TunedBackend::supportsTensorAlloc(c10::DeviceIndex deviceIdx) {
  if (deviceIdx < 0) {
    return cpu_->supportsTensorAlloc(deviceIdx);
  }
  if (auto nccl = nccl_.existing()) {
    return nccl->supportsTensorAlloc(deviceIdx);
  }
  if (!nccl_.available()) {
    return false;
  }
  return cudaSideFor("supports_tensor_alloc").supportsTensorAlloc(deviceIdx);
}

at::Tensor TunedBackend::allocateTensor(long size, at::TensorOptions options) {
  requireMembers("allocate_tensor");
  if (options.has_device() && options.device().is_cuda()) {
    return cudaSideFor("allocate_tensor").allocateTensor(size, options);
  }
  TORCH_CHECK(!options.has_device() || options.device().is_cpu(), "tunedist: allocate_tensor on rank ", rank_,
              ": `tuned` allocates CPU and CUDA tensors, got device ", options.device());
  return cpu_->allocateTensor(size, options);
}

#ifdef C10D_BACKEND_HAS_WINDOW
bool TunedBackend::supportsWindow() const {
  const auto device = getBoundDeviceId();
  if (device.has_value() && device->is_cuda()) {
    auto nccl = boundCudaSide();
    return nccl && nccl->supportsWindow();
  }
  return cpu_->supportsWindow();
}

c10::intrusive_ptr<c10d::Window> TunedBackend::new_window(const std::optional<at::Tensor>& tensor) {
  constexpr const char* kOp = "new_window";
  const auto bound = getBoundDeviceId();
  const bool cuda = tensor.has_value() && tensor->defined() ? tensor->is_cuda() : bound.has_value() && bound->is_cuda();
  if (!cuda) {
    return cpu_->new_window(tensor);
  }
  c10d::Backend& nccl = cudaSideFor(kOp);
  TORCH_CHECK(nccl.supportsWindow(), "tunedist: ", kOp, ": rank ", rank_, " of ", size_, ": the group's CUDA side (",
              nccl.getBackendName(),
              ") does not offer one-sided windows in this torch; CPU tensors get windows from tuned");
  return nccl.new_window(tensor);
}
#endif

}  // namespace tunedist
