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

// Error feedback, step 2, region by region: error -= each region of `input` (the bucket's buffer) once it holds its
// decompressed values, while they are in cache. Regions that do not tile `input` with contiguous views (and an
// undefined `error`: no error feedback) fall back to one whole-buffer subtraction in finish().
class ErrorFeedbackUpdate {
 public:
  ErrorFeedbackUpdate(at::Tensor error, at::Tensor input, const std::vector<at::Tensor>& regions);
  // The part of the error behind `region` (one of the constructor's regions), undefined without per-region updates.
  at::Tensor sliceFor(const at::Tensor& region) const;
  // error[region] -= region (nothing without per-region updates).
  void subtract(const at::Tensor& region);
  // error -= input unless every region was subtracted on its own.
  void finish();

 private:
  at::Tensor error_;
  at::Tensor input_;
  bool perRegion_ = false;
};

// Whether writeRankOne handles these tensors: contiguous CPU float32, out (n, m), p n and q m elements.
bool canWriteRankOne(const at::Tensor& out, const at::Tensor& p, const at::Tensor& q);
// out = p q^T (the decompression at rank 1) and, if errorSlice is defined, errorSlice -= out, in one pass; each
// element is the one rounded product p_i * q_j that bmm computes, so the bits are bmm's.
void writeRankOne(at::Tensor& out, const at::Tensor& p, const at::Tensor& q, const at::Tensor& errorSlice);

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
