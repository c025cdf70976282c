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

// powerSGD_hook's error feedback for one bucket step. The constructor (state's lock held) does step 1: the bucket
// += its error. Each region (one of `regions`, views of the bucket that tile it) then gets its decompressed values
// through replace() or writeRankOne(sliceFor(region)), which also set error = the region's error-fed values - its
// new values (step 2); finish() does step 2 where that could not be done region by region (other devices or
// dtypes, regions that do not tile the bucket: then step 1 kept a copy of the error-fed bucket). Without
// use_error_feedback it only writes the values.
class ErrorFeedback {
 public:
  ErrorFeedback(PowerSgdState& state, int64_t index, at::Tensor input, const std::vector<at::Tensor>& regions,
                const char* op);
  // Whether regions are replaced one by one (then decompressed values go through a scratch buffer, not the region).
  bool perRegion() const { return perRegion_; }
  // The part of the error behind `region`; undefined unless perRegion().
  at::Tensor sliceFor(const at::Tensor& region) const;
  // region = values (values: region's size), updating the error per region.
  void replace(at::Tensor& region, const at::Tensor& values);
  // error = copy - input, unless done per region.
  void finish();

 private:
  at::Tensor input_;
  at::Tensor error_;  // undefined without error feedback
  bool perRegion_ = false;
};

// Whether writeRankOne handles these tensors: contiguous CPU float32, out (n, m), p n and q m elements.
bool canWriteRankOne(const at::Tensor& out, const at::Tensor& p, const at::Tensor& q);
// out = p q^T (the decompression at rank 1) and, if errorSlice is defined, errorSlice = out's old values - new ones,
// in one pass; each element is the one rounded product p_i * q_j that bmm computes, so the bits are bmm's.
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
