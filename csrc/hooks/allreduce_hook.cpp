// allreduce_hook (the mean, as DDP without a hook) and the future helpers every hook uses.
#include <ATen/core/jit_type.h>

#include "hooks/hook_common.h"

namespace tunedist::hooks {
namespace {

class AllreduceCommHook : public TensorResultHook {
 public:
  explicit AllreduceCommHook(GroupPtr group) : group_(std::move(group)) {}
  FuturePtr runHook(c10d::GradBucket& bucket) override { return allreduceMean(group_, bucket.getBufferRef()); }

 private:
  GroupPtr group_;
};

}  // namespace

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

FuturePtr allreduceMean(const GroupPtr& group, at::Tensor& buffer) {
  TORCH_CHECK(group, "tunedist.hooks.allreduce_hook: no process group");
  buffer.div_(group->getSize());
  return allreduceSum(group, buffer)->then(
      [](c10::ivalue::Future& fut) { return c10::IValue(hookResultTensor(fut.value())); }, c10::TensorType::get());
}

std::unique_ptr<c10d::CommHookInterface> makeAllreduceHook(GroupPtr group) {
  TORCH_CHECK(group, "tunedist.hooks.register: allreduce needs a process group");
  return std::make_unique<AllreduceCommHook>(std::move(group));
}

}  // namespace tunedist::hooks
