// What both PowerSGD hooks (powersgd_hook.cpp, batched_powersgd_hook.cpp) share around PowerSgdState (internal
// header; state.cpp): the start of a bucket's step, the reused buffers, the P and Q memories with Q's seeding, P's
// allreduce, the end of a step. Error feedback: error_feedback.h; the products: low_rank.h and
// tunedist/hooks/kernels.h.
#pragma once

#include <mutex>
#include <vector>

#include "hooks/common.h"

namespace tunedist::hooks {

// The start of both PowerSGD hooks: checks the arguments and takes the state's lock. Before start_powerSGD_iter
// it counts the step, releases the lock and sets `allreduced` to allreduce_hook's future.
struct PowerSgdStart {
  std::unique_lock<std::mutex> lock;  // the state's mutex, held unless `allreduced` is set
  FuturePtr allreduced;
  at::Tensor input;   // the bucket's buffer
  int64_t index = 0;  // the bucket's index
};
PowerSgdStart startPowerSgd(const std::shared_ptr<PowerSgdState>& state, const GroupPtr& group,
                            c10d::GradBucket& bucket, const char* op);

// The tensor in `slot` if it has `sizes`, dtype and device already, else a new one (empty) stored there: the
// workspaces' buffers, kept from step to step.
at::Tensor reuse(at::Tensor& slot, at::IntArrayRef sizes, const at::TensorOptions& options);

// Step 4's P and Q memories, state.pMemoryDict[index] and state.qMemoryDict[index] (caller holds the lock). With
// warm start the dict entries of an earlier step (or a loaded state) stay, and the caller checks that they fit;
// otherwise new tensors, or without warm start the workspace's buffers (reuse). Returns whether they are new, so
// that Q must be drawn afresh (fillQsWithNormal).
bool prepareMemories(PowerSgdState& state, int64_t index, at::IntArrayRef pSizes, at::IntArrayRef qSizes,
                     const at::TensorOptions& options);

// Q initialisation of both PowerSGD hooks, as torch's: seed = state.rng.randint(1_000_000_000); a CPU generator
// seeded with it (torch.manual_seed inside fork_rng); each q in order gets randn(q.sizes()) drawn on the CPU in
// q's dtype, copied to q's device. The global torch generator is not touched.
void fillQsWithNormal(PowerSgdState& state, std::vector<at::Tensor>& qs);

// Allreduces (sums) P and waits for it on this thread (P is orthogonalised before Q = M^T P); throws, naming the
// rank, if it failed.
void allreducePAndWait(const GroupPtr& group, const at::Tensor& p, const char* op);

// The end of a bucket's decompression (caller holds the lock): without warm start the memories are dropped; after
// the step's last bucket, iter counts the step.
void endPowerSgdStep(PowerSgdState& state, bool isLast);

}  // namespace tunedist::hooks
