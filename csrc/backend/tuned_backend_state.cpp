// TunedBackend: the calls without tensors that reach both sides: ephemeral timeouts, the error state and completion
// hooks. Each goes to the CPU side and, once it exists, to the NCCL side (cuda::NcclSide::whenCreated for hooks
// registered before the group's first CUDA call).
#include <c10/util/Exception.h>

#include <memory>
#include <utility>

#include "backend/tuned_backend.h"

namespace tunedist {

void TunedBackend::addEphemeralTimeout(const std::chrono::milliseconds& extra) {
  cpu_->addEphemeralTimeout(extra);
  if (auto nccl = nccl_.existing()) {
    nccl->addEphemeralTimeout(extra);
  }
}

c10d::ErrorType TunedBackend::getError() {
  const c10d::ErrorType cpu = cpu_->getError();
  if (cpu != c10d::ErrorType::SUCCESS) {
    return cpu;
  }
  auto nccl = nccl_.existing();
  return nccl ? nccl->getError() : c10d::ErrorType::SUCCESS;
}

void TunedBackend::registerOnCompletionHook(std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) {
  // One hook for both sides: shared, so the callable (a Python function torch wraps) is never copied.
  auto shared = std::make_shared<std::function<void(std::shared_ptr<c10d::WorkInfo>)>>(std::move(hook));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    infoHook_ = shared;  // for the CPU side of a new membership (reconfigure)
  }
  cpu_->registerOnCompletionHook([shared](std::shared_ptr<c10d::WorkInfo> info) { (*shared)(std::move(info)); });
  const int rank = rank_;
  nccl_.whenCreated([shared, rank](c10d::Backend& nccl) {
    try {
      nccl.registerOnCompletionHook([shared](std::shared_ptr<c10d::WorkInfo> info) { (*shared)(std::move(info)); });
    } catch (const std::exception& e) {
      TORCH_WARN("tunedist: rank ", rank, ": the on-completion hook reports the CPU operations only; the NCCL side (",
                 nccl.getBackendName(), ") refused it: ", e.what());
    }
  });
}

#ifdef C10D_BACKEND_HAS_HOOKS
bool TunedBackend::supportsCompletionHooks() const {
  if (!cuda::ncclBuildInfo().compiledIn) {
    return true;
  }
  auto nccl = nccl_.existing();
  return nccl && nccl->supportsCompletionHooks();
}

void TunedBackend::registerCompletionHook(int64_t hookId, c10d::CompletionHook hook) {
  TORCH_CHECK(supportsCompletionHooks(), "tunedist: registerCompletionHook on rank ", rank_,
              ": this group's NCCL side does not report completions (supportsCompletionHooks() is false)");
  auto shared = std::make_shared<c10d::CompletionHook>(std::move(hook));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completionHooks_[hookId] = shared;  // for the CPU side of a new membership (reconfigure)
  }
  cpu_->registerCompletionHook(hookId, [shared](const c10d::CompletionHookArgs& args) { (*shared)(args); });
  if (auto nccl = nccl_.existing()) {
    nccl->registerCompletionHook(hookId, [shared](const c10d::CompletionHookArgs& args) { (*shared)(args); });
  }
}

void TunedBackend::unregisterCompletionHook(int64_t hookId) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completionHooks_.erase(hookId);
  }
  cpu_->unregisterCompletionHook(hookId);
  if (auto nccl = nccl_.existing(); nccl && nccl->supportsCompletionHooks()) {
    nccl->unregisterCompletionHook(hookId);
  }
}
#endif

}  // namespace tunedist
