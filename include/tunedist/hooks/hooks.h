// tunedist's DDP communication hooks in C++: the same algorithms and state as torch's Python hooks
// (default_hooks.py, powerSGD_hook.py), as c10d::CommHookInterface objects for Reducer::register_comm_hook and as
// plain functions of a GradBucket (what the Python drop-in modules call).
//
// Every hook divides by the group size itself (the Reducer does not when a hook is installed) and returns a future
// whose value is the bucket's (averaged) tensor.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include <memory>

#include "tunedist/hooks/kernels.h"
#include "tunedist/hooks/powersgd_state.h"

namespace tunedist::hooks {

using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;
using GroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;

// Reused low-precision buffers of the fp16/bf16 hooks and wrappers: a buffer goes back to the pool once its bucket
// is decompressed, so the pool holds at most one buffer per bucket in flight.
class CompressionPool;

// allreduce_hook: bucket /= size; allreduce (sum).
FuturePtr allreduceMean(const GroupPtr& group, at::Tensor& buffer);
// fp16_compress_hook / bf16_compress_hook: compress (cast, divide) into a low-precision buffer (from `pool` when
// given), allreduce it, decompress into the bucket.
FuturePtr runCompressHook(const GroupPtr& group, c10d::GradBucket& bucket, at::ScalarType dtype,
                          const std::shared_ptr<CompressionPool>& pool);
// powerSGD_hook and batched_powerSGD_hook.
// Both take the state shared: the decompression finishes after the call returns.
FuturePtr runPowerSgd(const std::shared_ptr<PowerSgdState>& state, const GroupPtr& group, c10d::GradBucket& bucket);
FuturePtr runBatchedPowerSgd(const std::shared_ptr<PowerSgdState>& state, const GroupPtr& group,
                             c10d::GradBucket& bucket);

// The hook objects for Reducer::register_comm_hook.
std::unique_ptr<c10d::CommHookInterface> makeAllreduceHook(GroupPtr group);
std::unique_ptr<c10d::CommHookInterface> makeCompressHook(GroupPtr group, at::ScalarType dtype);
std::unique_ptr<c10d::CommHookInterface> makePowerSgdHook(GroupPtr group, std::shared_ptr<PowerSgdState> state,
                                                          bool batched);
// fp16_compress_wrapper / bf16_compress_wrapper around a C++ hook.
std::unique_ptr<c10d::CommHookInterface> makeLowPrecisionWrapper(std::unique_ptr<c10d::CommHookInterface> inner,
                                                                 at::ScalarType dtype);

// The tensor a hook's future holds (a Tensor, or a TensorList whose first element is the bucket).
at::Tensor hookResultTensor(const c10::IValue& result);

std::shared_ptr<CompressionPool> makeCompressionPool();

}  // namespace tunedist::hooks
