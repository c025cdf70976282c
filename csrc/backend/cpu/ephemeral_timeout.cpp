// Ephemeral timeout extensions (Backend::addEphemeralTimeout), as torch's NCCL backend keeps them: an extension adds
// to the timeout of every operation issued after the call, until the first of those operations has completed; calls
// accumulate and each expires on its own. Operations issued before the call keep their timeout.
#include <algorithm>

#include "backend/cpu/cpu_backend.h"

namespace tunedist::cpu {

void CpuBackend::addEphemeralTimeout(const std::chrono::milliseconds& extra) {
  if (extra.count() <= 0) {
    return;
  }
  std::lock_guard<std::mutex> lock(optionsMutex_);
  ephemeral_.push_back(EphemeralTimeout{extra, false, nullptr});
  hasEphemeral_.store(true, std::memory_order_relaxed);
}

void CpuBackend::bindEphemeral(const c10::intrusive_ptr<c10d::Work>& work) {
  std::lock_guard<std::mutex> lock(optionsMutex_);
  for (auto& e : ephemeral_) {
    if (!e.bound) {
      e.bound = true;
      e.first = work;  // null: a synchronous call that ran inline, complete already
    }
  }
  ephemeralLocked();
}

std::chrono::milliseconds CpuBackend::ephemeralLocked() const {
  ephemeral_.erase(std::remove_if(ephemeral_.begin(), ephemeral_.end(),
                                  [](const EphemeralTimeout& e) {
                                    return e.bound && (!e.first || e.first->isCompleted());
                                  }),
                   ephemeral_.end());
  std::chrono::milliseconds sum{0};
  for (const auto& e : ephemeral_) {
    sum += e.extra;
  }
  hasEphemeral_.store(!ephemeral_.empty(), std::memory_order_relaxed);
  return sum;
}

}  // namespace tunedist::cpu
