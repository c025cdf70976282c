// allreduce_hook: the mean, as DDP without a hook (bucket /= size; allreduce). PowerSGD's hooks run it before
// start_powerSGD_iter (powersgd/state.cpp: startPowerSgd).
#include <ATen/core/jit_type.h>

#include "hooks/common.h"

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

FuturePtr allreduceMean(const GroupPtr& group, at::Tensor& buffer) {
  TORCH_CHECK(group, "tunedist.hooks.allreduce_hook: no process group");
  buffer.div_(group->getSize());
  return allreduceSum(group, buffer)
      ->then([](c10::ivalue::Future& fut) { return c10::IValue(hookResultTensor(fut.value())); },
             c10::TensorType::get());
}

std::unique_ptr<c10d::CommHookInterface> makeAllreduceHook(GroupPtr group) {
  TORCH_CHECK(group, "tunedist.hooks.register: allreduce needs a process group");
  return std::make_unique<AllreduceCommHook>(std::move(group));
}

}  // namespace tunedist::hooks
