// TunedBackend's fault tolerance: dist.shrink_group (shrink) and abort hooks.
//
// Shrinking makes the survivors' group as a new group is made: a TunedBackend over a prefix of this group's store
// that no other group uses ("tuned_shrink/<n>/<excluded ranks>/", n counting this group's shrinks, which every
// survivor calls in the same order), ranks renumbered in their old order as torch does (a survivor's new rank is
// its old one less the excluded ranks below it). Nothing of the parent is reused and nothing waits for an excluded
// rank: the new group finds its hosts among the survivors' keys and maps fresh segments at its first operation,
// while the parent, which torch destroys right after, drops its mappings of the old segments and its symmetric
// heap's names without a word to the dead rank (a mapping that nobody holds any more is freed by the kernel).
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/tuned_backend.h"

namespace tunedist {
namespace {

// torch.distributed.distributed_c10d.SHRINK_ABORT.
constexpr int kShrinkAbort = 0x01;

}  // namespace

c10::intrusive_ptr<c10d::Backend> TunedBackend::shrink(const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
                                                       const c10::intrusive_ptr<c10d::Backend::Options>& optsOverride) {
  requireMembers("shrink");
  std::vector<int64_t> excluded(ranksToExclude);
  std::sort(excluded.begin(), excluded.end());
  TORCH_CHECK(!excluded.empty(), "tunedist: shrink on rank ", rank_, ": no rank to exclude");
  TORCH_CHECK(std::adjacent_find(excluded.begin(), excluded.end()) == excluded.end(), "tunedist: shrink on rank ",
              rank_, ": a rank is excluded twice");
  TORCH_CHECK(excluded.front() >= 0 && excluded.back() < size_, "tunedist: shrink on rank ", rank_, ": rank ",
              excluded.front() < 0 ? excluded.front() : excluded.back(), " is not in the group of ", size_, " ranks");
  TORCH_CHECK(int64_t(excluded.size()) < size_, "tunedist: shrink on rank ", rank_, ": excluding all ", size_,
              " ranks leaves no group");
  TORCH_CHECK(!std::binary_search(excluded.begin(), excluded.end(), int64_t(rank_)), "tunedist: shrink on rank ", rank_,
              ": this rank is excluded; only the ranks that remain call shrink_group");
  TORCH_CHECK((shrinkFlags & ~kShrinkAbort) == 0, "tunedist: shrink on rank ", rank_, ": unknown shrink flags ",
              shrinkFlags, " (SHRINK_DEFAULT 0 or SHRINK_ABORT 1)");
  TORCH_CHECK(!cpu_->isShutDown() || (shrinkFlags & kShrinkAbort), "tunedist: shrink on rank ", rank_,
              ": the process group was shut down or aborted");

  Options child{cpu_->options(), onNcclCreated_, ncclFactory_};
  child.stableRank = stableRank_;
  child.reconfigureStore = groupStore_;
  if (optsOverride && optsOverride->timeout.count() > 0) {
    child.cpu.timeout = optsOverride->timeout;
  }
  const uint64_t n = shrinks_++;
  // The NCCL side shrinks itself where it can (before an abort would tear its communicator down).
  c10::intrusive_ptr<c10d::Backend> ncclChild = shrinkNcclSide(ranksToExclude, shrinkFlags, optsOverride);
  if (shrinkFlags & kShrinkAbort) {
    // Whatever was in flight in this group fails now (its hooks run first); the new group shares nothing with it.
    abort();
  }
  const int newRank = rank_ -
                      int(std::lower_bound(excluded.begin(), excluded.end(), int64_t(rank_)) - excluded.begin());
  const int newSize = size_ - int(excluded.size());
  std::string prefix = "tuned_shrink/" + std::to_string(n) + "/";
  for (size_t i = 0; i < excluded.size(); ++i) {
    prefix += (i ? "," : "") + std::to_string(excluded[i]);
  }
  // A connection of its own where the store has one to give (TCPStore): the parent's, torn down when torch destroys
  // it, then cannot hold up the new group's store calls.
  c10::intrusive_ptr<c10d::Store> base;
  try {
    base = store_->clone();
  } catch (const std::exception&) {
    base = store_;  // a store without clone() (HashStore): shared
  }
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix + "/", base);
  auto shrunk = c10::make_intrusive<TunedBackend>(store, newRank, newSize, std::move(child));
  if (ncclChild) {
    shrunk->nccl_.adopt(std::move(ncclChild));
  }
  return shrunk;
}

#ifdef C10D_BACKEND_HAS_HOOKS
void TunedBackend::registerAbortHook(int64_t hookId, c10d::AbortHook hook) {
  abortHooks_->add(hookId, hook, rank_);
  forwardAbortHook(hookId, std::move(hook));
}

void TunedBackend::unregisterAbortHook(int64_t hookId) {
  abortHooks_->remove(hookId);
  forwardAbortHookRemoval(hookId);
}
#endif

}  // namespace tunedist
