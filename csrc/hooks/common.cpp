// What every hook shares; see common.h.
#include "hooks/common.h"

#include <ATen/core/jit_type.h>

#include "hooks/cuda/cuda_kernels.h"

namespace tunedist::hooks {

at::Tensor hookResultTensor(const c10::IValue& result) {
  if (result.isTensor()) return result.toTensor();
  TORCH_CHECK(result.isTensorList() && !result.toTensorList().empty(),
              "tunedist.hooks: a communication hook's future must hold a Tensor or a non-empty TensorList, got ",
              result.tagKind());
  return result.toTensorList().get(0);
}

int groupRank(const GroupPtr& group) { return group ? group->getRank() : -1; }

FuturePtr completedFuture(const at::Tensor& value) {
  auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get());
  fut->markCompleted(c10::IValue(value));
  return fut;
}

FuturePtr allreduceSum(const GroupPtr& group, const at::Tensor& tensor) {
  if (tensor.numel() == 0) {
    auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
    fut->markCompleted(c10::IValue(std::vector<at::Tensor>{tensor}));
    return fut;
  }
  std::vector<at::Tensor> tensors{tensor};
  return group->allreduce(tensors)->getFuture();
}

// The hooks' CUDA kernels (hooks/cuda) serve fp16/bf16 compression and PowerSGD's error feedback.
bool cudaKernelsBuilt() { return cuda::kBuilt; }

}  // namespace tunedist::hooks
