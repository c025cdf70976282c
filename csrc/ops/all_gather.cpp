// torch.ops.tunedist.all_gather_into_tensor_: dist.all_gather_into_tensor(output, input, group), synchronously,
// without torch.distributed's Python layer (see all_reduce.cpp): the group's backend runs its _allgather_base.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>

#include "ops/common.h"

namespace tunedist::direct {
namespace {

void allGatherIntoTensor(at::Tensor& output, const at::Tensor& input, std::string groupName) {
  c10d::AllgatherOptions opts;
  opts.asyncOp = false;
  at::Tensor in = input;
  waitFor(backendFor("tunedist.all_gather_into_tensor", groupName, output.device().type())
              ->_allgather_base(output, in, opts));
}

void allGatherIntoTensorMeta(at::Tensor& /*output*/, const at::Tensor& /*input*/, std::string /*groupName*/) {}

}  // namespace

TORCH_LIBRARY_IMPL(tunedist, CPU, m) { m.impl("all_gather_into_tensor_", allGatherIntoTensor); }
TORCH_LIBRARY_IMPL(tunedist, CUDA, m) { m.impl("all_gather_into_tensor_", allGatherIntoTensor); }
TORCH_LIBRARY_IMPL(tunedist, Meta, m) { m.impl("all_gather_into_tensor_", allGatherIntoTensorMeta); }

}  // namespace tunedist::direct
