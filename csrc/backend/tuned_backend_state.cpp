// TunedBackend: the calls without tensors that reach both sides: ephemeral timeouts, the error state, completion and
// abort hooks, and shrink's NCCL part. Each goes to the CPU side and, once it exists, to the NCCL side
// (cuda::NcclSide::whenCreated for hooks registered before the group's first CUDA call).
#include <c10/util/Exception.h>

#include <memory>
#include <utility>

#include "backend/tuned_backend.h"

namespace tunedist {

void TunedBackend::addEphemeralTimeout(const std::chrono::milliseconds& extra) {
  cpu_->addEphemeralTimeout(extra);
#ifdef TUNEDIST_C10D_HAS_EPHEMERAL_TIMEOUT  // torch 2.11's c10d::Backend has no such call (nor does its ProcessGroup)
  if (auto nccl = nccl_.existing()) {
    nccl->addEphemeralTimeout(extra);
  }
#endif
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
  // As ProcessGroupNCCL keeps it: the group then reports hasHooks(), and destroy_process_group waits for the hooks
  // of what completed (waitForPendingWorks) before the interpreter may go away.
  onCompletionHook_ = [shared](std::shared_ptr<c10d::WorkInfo> info) { (*shared)(std::move(info)); };
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

#ifdef TUNEDIST_C10D_HAS_COMPLETION_HOOKS
// The CPU side reports completions, and so does the NCCL side where it exists and can. A group whose NCCL side is
// not made yet answers for the CPU side (a CPU-only job never makes one); hooks registered then are handed to the
// NCCL side when it is made, with a warning there if it cannot take them (torch 2.15's nccl2 can; the classic
// ProcessGroupNCCL cannot).
bool TunedBackend::supportsCompletionHooks() const {
  auto nccl = nccl_.existing();
  return cpu_->supportsCompletionHooks() && (!nccl || nccl->supportsCompletionHooks());
}

void TunedBackend::registerCompletionHook(int64_t hookId, c10d::CompletionHook hook) {
  TORCH_CHECK(supportsCompletionHooks(), "tunedist: registerCompletionHook on rank ", rank_,
              ": this group's NCCL side (", nccl_.existing()->getBackendName(),
              ") does not report completions (supportsCompletionHooks() is false)");
  auto shared = std::make_shared<c10d::CompletionHook>(std::move(hook));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completionHooks_[hookId] = shared;  // for the CPU side of a new membership (reconfigure)
  }
  cpu_->registerCompletionHook(hookId, [shared](const c10d::CompletionHookArgs& args) { (*shared)(args); });
  const int rank = rank_;
  nccl_.whenCreated([shared, hookId, rank](c10d::Backend& nccl) {
    if (!nccl.supportsCompletionHooks()) {
      TORCH_WARN("tunedist: rank ", rank, ": completion hook ", hookId, " reports the CPU operations only; the NCCL ",
                 "side (", nccl.getBackendName(), ") has no completion hooks");
      return;
    }
    nccl.registerCompletionHook(hookId, [shared](const c10d::CompletionHookArgs& args) { (*shared)(args); });
  });
}

void TunedBackend::unregisterCompletionHook(int64_t hookId) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completionHooks_.erase(hookId);
  }
  cpu_->unregisterCompletionHook(hookId);
  nccl_.whenCreated([hookId](c10d::Backend& nccl) {
    if (nccl.supportsCompletionHooks()) {
      nccl.unregisterCompletionHook(hookId);
    }
  });
}
#endif

#ifdef C10D_BACKEND_HAS_HOOKS
namespace {

// Whether the NCCL side takes abort hooks: its supportsAbortHooks() where c10d has it (torch 2.15), else whether it
// accepts the call (torch 2.14's Backend refuses registerAbortHook unless the backend overrides it).
template <typename Call>
void ifNcclTakesAbortHooks(c10d::Backend& nccl, Call&& call) {
#ifdef TUNEDIST_C10D_HAS_ABORT_HOOK_QUERY
  if (nccl.supportsAbortHooks()) {
    call();
  }
#else
  try {
    call();
  } catch (const c10::Error&) {
    // the NCCL side has no abort hooks: the group runs them on its own abort and failures only
  }
#endif
}

}  // namespace

// The NCCL side's watchdog aborts its communicator on a timeout or an NCCL error; handing it the group's abort hooks
// makes it run them then, as torch's "nccl" group would.
void TunedBackend::forwardAbortHook(int64_t hookId, c10d::AbortHook hook) {
  nccl_.whenCreated([hookId, hook = std::move(hook)](c10d::Backend& nccl) {
    ifNcclTakesAbortHooks(nccl, [&] { nccl.registerAbortHook(hookId, hook); });
  });
}

void TunedBackend::forwardAbortHookRemoval(int64_t hookId) {
  nccl_.whenCreated([hookId](c10d::Backend& nccl) {
    ifNcclTakesAbortHooks(nccl, [&] { nccl.unregisterAbortHook(hookId); });
  });
}
#endif

c10::intrusive_ptr<c10d::Backend> TunedBackend::shrinkNcclSide(
    const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
    const c10::intrusive_ptr<c10d::Backend::Options>& optsOverride) {
  auto nccl = nccl_.existing();
  if (!nccl || !nccl->supportsShrinking()) {
    return nullptr;
  }
  try {
    return nccl->shrink(ranksToExclude, shrinkFlags, optsOverride);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "tunedist: shrink on rank ", rank_, ": the NCCL side (", nccl->getBackendName(),
                ") failed to shrink: ", e.what_without_backtrace());
  }
}

}  // namespace tunedist
