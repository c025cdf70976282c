// Pieces shared by the hook implementations (internal header).
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include <mutex>
#include <vector>

#include "tunedist/hooks/hooks.h"

namespace tunedist::hooks {

// A CommHookInterface whose futures hold a Tensor or a TensorList (c10d's own parseCppCommHookResult is not
// exported by every torch build, so this does not derive from CppCommHookInterface).
class TensorResultHook : public c10d::CommHookInterface {
 public:
  at::Tensor parseHookResult(const c10::IValue& result) override { return hookResultTensor(result); }
};

// allreduce (sum) of one tensor; the future holds a TensorList. An empty tensor is not sent (every rank has the
// same bucket layout, so all skip it together): the future is already complete.
FuturePtr allreduceSum(const GroupPtr& group, const at::Tensor& tensor);
// A future already completed with `value`.
FuturePtr completedFuture(const at::Tensor& value);

class CompressionPool {
 public:
  // A contiguous tensor of `numel` elements of `options`, reusing a released buffer when one is large enough.
  at::Tensor acquire(int64_t numel, const at::TensorOptions& options);
  // Gives back a tensor acquire() returned, once nothing reads or writes it any more.
  void release(const at::Tensor& tensor);
  int64_t bytes() const;

 private:
  mutable std::mutex mutex_;
  std::vector<at::Tensor> free_;  // whole buffers
  int64_t bytes_ = 0;             // allocated by the pool: free and in use
};

// Q initialisation of both PowerSGD hooks, as torch's: seed = state.rng.randint(1_000_000_000); a CPU generator
// seeded with it (torch.manual_seed inside fork_rng); each q in order gets randn(q.sizes()) drawn on the CPU in
// q's dtype, copied to q's device. The global torch generator is not touched.
void fillQsWithNormal(PowerSgdState& state, std::vector<at::Tensor>& qs);

// Error feedback, step 1 (caller holds the state's mutex): input += error (creating the error the first time);
// the error buffer then holds a copy of input, so step 2 (error -= decompressed input) leaves copy - result.
void addErrorFeedback(PowerSgdState& state, int64_t bucketIndex, at::Tensor& input, const char* op);

// Whether `t` is a contiguous CPU float32 tensor: what the fused error-feedback loops and the low-rank kernels take.
inline bool cpuFloat(const at::Tensor& t) {
  return t.is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous();
}

// powerSGD_hook's error feedback for one bucket step, in two steps: 1. each region += its error; 2. once the
// region's decompressed values are known, error = the region's error-fed values - its new values, region = new
// values. Regions are `regions`, views of the bucket that tile it (GradBucket's gradients).
// Per region (contiguous CPU float32, perRegion()): step 1 is applyPending(region), or fused with the region's
// first use (pendingSlice(region): the error a kernel adds while reading the region, e.g. P = (M + E) Q); step 2 is
// replace() or writePQt(..., sliceFor(region)), one pass each. Every region must get step 1 exactly once, before
// anything reads its values. Elsewhere (other devices or dtypes, regions that do not tile the bucket) the
// constructor does step 1 for the whole bucket and keeps a copy of it, finish() does step 2, and the per-region
// calls only write values. Without use_error_feedback nothing is added and values are only written.
class ErrorFeedback {
 public:
  // Called with the state's lock held.
  ErrorFeedback(PowerSgdState& state, int64_t index, at::Tensor input, const std::vector<at::Tensor>& regions,
                const char* op);
  // Whether the error is handled region by region (the bucket and its regions are contiguous CPU float32).
  bool perRegion() const { return perRegion_; }
  // The part of the error behind `region`; undefined unless perRegion().
  at::Tensor sliceFor(const at::Tensor& region) const;
  // Step 1 for `region`, if it is still to be done (per region and the bucket had an error from a previous step).
  void applyPending(const at::Tensor& region) const;
  // The error the caller must add to `region` itself (step 1, fused); undefined if there is none.
  at::Tensor pendingSlice(const at::Tensor& region) const;
  // region = values (values: region's size), updating the error per region.
  void replace(at::Tensor& region, const at::Tensor& values);
  // error = copy - input, unless done per region.
  void finish();

 private:
  at::Tensor input_;
  at::Tensor error_;  // undefined without error feedback
  bool perRegion_ = false;
  bool pending_ = false;  // per region: step 1 is left to the caller, region by region
};

// P = (M + E) Q for a matrix M with the error E still to add (ErrorFeedback::pendingSlice), M += E in the same
// pass on our kernels; on the ATen path M += E, then mm.
void addErrorAndMultiplyMQ(at::Tensor& matrix, const at::Tensor& error, const at::Tensor& q, at::Tensor& p);

// The start of both PowerSGD hooks: checks the arguments and takes the state's lock. Before start_powerSGD_iter
// it counts the step, releases the lock and sets `allreduced` to allreduce_hook's future.
struct PowerSgdStart {
  std::unique_lock<std::mutex> lock;  // the state's mutex, held unless `allreduced` is set
  FuturePtr allreduced;
  at::Tensor input;                   // the bucket's buffer
  int64_t index = 0;                  // the bucket's index
};
PowerSgdStart startPowerSgd(const std::shared_ptr<PowerSgdState>& state, const GroupPtr& group,
                            c10d::GradBucket& bucket, const char* op);

// Rank of this process in `group`, for error messages.
int groupRank(const GroupPtr& group);

}  // namespace tunedist::hooks
