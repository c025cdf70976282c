// One-sided windows on a `tuned` group (c10d::Backend::supportsWindow / new_window; torch's
// dist.distributed_c10d._supports_window and _new_window): a CUDA tensor's window is the NCCL side's, where that
// backend offers windows; every other call is the CPU side's (backend/cpu/window.cpp).
#include "backend/tuned_backend.h"

namespace tunedist {

#ifdef C10D_BACKEND_HAS_WINDOW

bool TunedBackend::supportsWindow() const { return cpu_->supportsWindow(); }

c10::intrusive_ptr<c10d::Window> TunedBackend::new_window(const std::optional<at::Tensor>& tensor) {
  constexpr const char* kOp = "new_window";
  if (!tensor.has_value() || !tensor->defined() || !tensor->is_cuda()) {
    return cpu_->new_window(tensor);
  }
  c10d::Backend* nccl = nullptr;
  try {
    nccl = &nccl_.get(getBoundDeviceId());
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "tunedist: ", kOp, ": rank ", rank_, " of ", size_, ": ", e.what_without_backtrace());
  }
  TORCH_CHECK(nccl->supportsWindow(), "tunedist: ", kOp, ": rank ", rank_, " of ", size_, ": the group's CUDA side (",
              nccl->getBackendName(),
              ") does not offer one-sided windows in this torch; CPU tensors get windows "
              "from tuned");
  return nccl->new_window(tensor);
}

#endif

}  // namespace tunedist
