// AbortHooks: the abort hooks registered on one `tuned` group (Backend::registerAbortHook, torch's
// ProcessGroup.register_abort_hook), run before the group aborts: when abort() is called (also by
// dist.shrink_group with SHRINK_ABORT and by destroy paths that abort), and when one of its collectives fails or
// times out. torch asks hooks to be idempotent, since one failure may run them more than once; the group runs them
// once per failed operation and once per abort() call.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>  // C10D_BACKEND_HAS_HOOKS
#ifdef C10D_BACKEND_HAS_HOOKS
#include <torch/csrc/distributed/c10d/Hooks.hpp>
#endif

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace tunedist {

// torch's c10d::AbortHook where c10d has abort hooks (C10D_BACKEND_HAS_HOOKS, torch 2.14 on); before that the group
// still runs its own failure path through this class, which then holds no hooks (no API registers any).
#ifdef C10D_BACKEND_HAS_HOOKS
using AbortHook = c10d::AbortHook;
#else
using AbortHook = std::function<void()>;
#endif

class AbortHooks {
 public:
  // Refuses an id that is registered already (torch keys hooks by id so they can be removed one by one).
  void add(int64_t id, AbortHook hook, int rank) {
    TORCH_CHECK(hook, "tunedist: register_abort_hook on rank ", rank, ": hook ", id, " is empty");
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(hooks_.emplace(id, std::move(hook)).second, "tunedist: register_abort_hook on rank ", rank,
                ": a hook with id ", id, " is registered already; unregister it first");
  }

  // Removing an id that is not registered does nothing.
  void remove(int64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    hooks_.erase(id);
  }

  // Before abort(): runs the hooks, and from then on a failure runs none (the abort fails every operation in
  // flight, and their hooks would run on the worker threads that abort() joins, perhaps holding the GIL).
  void runForAbort(int rank) {
    aborting_.store(true);
    run(rank);
  }

  // The group's current membership; reconfigure starts a new one (newMembership).
  uint64_t membership() const { return membership_.load(); }
  // Before a reconfigure switches members: the group runs again, so its failures run the hooks again, but not the
  // failures of the old membership, which the switch itself brings about.
  void newMembership() {
    membership_.fetch_add(1);
    aborting_.store(false);
  }

  // When an operation of `membership` failed: runs the hooks unless the group is being aborted or has moved on to
  // other members.
  void runForFailure(int rank, uint64_t membership) const {
    if (!aborting_.load() && membership == membership_.load()) {
      run(rank);
    }
  }

 private:
  // Runs every hook in id order, outside the lock (a hook may register or remove hooks). A hook that throws is
  // logged and the others still run: the abort goes on regardless.
  void run(int rank) const {
    std::vector<std::pair<int64_t, AbortHook>> hooks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      hooks.assign(hooks_.begin(), hooks_.end());
    }
    for (auto& [id, hook] : hooks) {
      try {
        hook();
      } catch (const std::exception& e) {
        LOG(WARNING) << "tunedist: abort hook " << id << " on rank " << rank << " raised: " << e.what();
      }
    }
  }

  mutable std::mutex mutex_;
  std::atomic<bool> aborting_{false};
  std::atomic<uint64_t> membership_{0};
  std::map<int64_t, AbortHook> hooks_;
};

}  // namespace tunedist
