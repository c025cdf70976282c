// TunedBackend's device dispatch: the NCCL side for calls with CUDA tensors, and the group facts it forwards there.
#include <c10/util/Exception.h>

#include "backend/backend.h"

namespace tunedist {

c10d::Backend* TunedBackend::cudaSideFor(const char* op, const DeviceScan& scan, bool failGroup) {
  c10d::Backend* nccl = nullptr;
  bool startCoalescing = false;
  try {
    TORCH_CHECK(!scan.cpu, "mixes CPU and CUDA tensors; one call runs on one device type, so move all its tensors "
                "to the same device");
    nccl = &nccl_.get(getBoundDeviceId());
    {
      std::lock_guard<std::mutex> lock(mutex_);
      startCoalescing = coalescing_ && !ncclCoalescing_;
      ncclCoalescing_ = ncclCoalescing_ || coalescing_;
    }
  } catch (const c10::Error& e) {
    if (failGroup) {
      rejectCall(op, e.what_without_backtrace());
    }
    TORCH_CHECK(false, "tunedist: ", op, " on rank ", rank_, " of ", size_, ": ", e.what_without_backtrace());
  }
  if (startCoalescing) {
    nccl->startCoalescing();
  }
  return nccl;
}

void TunedBackend::setGroupUid(const std::string& pgUid) {
  c10d::Backend::setGroupUid(pgUid);
  nccl_.setGroupUid(pgUid);
}

}  // namespace tunedist
