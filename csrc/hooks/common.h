// What every hook shares (internal header; common.cpp): the hook object's result parsing, the allreduce every
// hook ends in, completed futures, and the tensor test our CPU kernels share. The hooks themselves:
// allreduce_hook.cpp, compress/ (fp16/bf16) and powersgd/ (both PowerSGD hooks and everything they use).
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/comm.hpp>

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

// Rank of this process in `group`, for error messages.
int groupRank(const GroupPtr& group);

// Whether `t` is a contiguous CPU float32 tensor: what our CPU kernels take (fp16/bf16 compression's wide side,
// PowerSGD's error feedback, low-rank products and Gram-Schmidt).
inline bool cpuFloat(const at::Tensor& t) { return t.is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(); }

}  // namespace tunedist::hooks
