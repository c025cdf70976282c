// torch.ops.tunedist.all_gather_into_tensor_: dist.all_gather_into_tensor(output, input, group), synchronously,
// without torch.distributed's Python layer (see all_reduce.cpp): the group's backend runs its _allgather_base.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>

#include "ops/common.h"

namespace tunedist::ops {
namespace {

template <typename Group>
void allGatherIntoTensor(at::Tensor& output, const at::Tensor& input, Group group) {
  c10d::AllgatherOptions opts;
  opts.asyncOp = false;
  at::Tensor in = input;
  waitFor(
      backendFor("tunedist.all_gather_into_tensor", group, output.device().type())->_allgather_base(output, in, opts));
}

template <typename Group>
void allGatherIntoTensorMeta(at::Tensor& /*output*/, const at::Tensor& /*input*/, Group /*group*/) {}

}  // namespace

TUNEDIST_IMPL_BOTH_GROUPS("all_gather_into_tensor_", allGatherIntoTensor, allGatherIntoTensorMeta)

}  // namespace tunedist::ops
