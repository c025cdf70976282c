// One-sided windows on the CPU side (c10d::Backend::supportsWindow / new_window): a CpuWindow over the symmetric
// heap (backend/cpu/symm_mem/window.h), offered where every rank of the group is on this host. TunedBackend routes a
// CPU tensor's window (and a window without a tensor where the group has no CUDA device bound) here.
#include "backend/cpu/symm_mem/window.h"
#include "backend/cpu/cpu_backend.h"

namespace tunedist::cpu {

#ifdef C10D_BACKEND_HAS_WINDOW

// A CPU window maps its peers' memory, so every rank must be on this host. The layout is known from the keys each
// rank published at its creation (it waits, within the group's timeout, for a rank not created yet).
bool CpuBackend::supportsWindow() const {
  try {
    // hostLayout() fills the layout once, under its own lock; it is logically const.
    auto* self = const_cast<CpuBackend*>(this);
    return self->hostLayout(std::chrono::steady_clock::now() + effectiveTimeout(c10d::kUnsetTimeout)).oneHost();
  } catch (const std::exception&) {
    return false;
  }
}

c10::intrusive_ptr<c10d::Window> CpuBackend::new_window(const std::optional<at::Tensor>& tensor) {
  constexpr const char* kOp = "new_window";
  TORCH_CHECK(!tensor.has_value() || !tensor->defined() || tensor->device().is_cpu(), "tunedist: ", kOp, ": rank ",
              rank_, " of ", size_, ": the CPU side makes windows of CPU tensors, got one on ", tensor->device());
  const auto& layout = hostLayout(std::chrono::steady_clock::now() + effectiveTimeout(c10d::kUnsetTimeout));
  TORCH_CHECK(layout.oneHost(), "tunedist: ", kOp, ": rank ", rank_, " of ", size_, ": the group spans ",
              layout.numHosts(),
              " hosts; a CPU window lets ranks load and store into each other's memory, which only "
              "ranks of one host share (a put to another host would be a send its target must receive: not "
              "one-sided). Make the window on a group of one host's ranks");
  auto window = c10::make_intrusive<symm_mem::CpuWindow>(
      c10::intrusive_ptr<c10d::Backend>::unsafe_reclaim_from_nonowning(this), *this);
  if (tensor.has_value() && tensor->defined()) {
    window->tensor_register(*tensor, true);
  }
  return window;
}

#endif

}  // namespace tunedist::cpu
