// torch.ops.tunedist.reduce_scatter_tensor_: dist.reduce_scatter_tensor(output, input, op, group), synchronously,
// without torch.distributed's Python layer (see all_reduce.cpp): the group's backend runs its _reduce_scatter_base.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>

#include "ops/common.h"

namespace tunedist::ops {
namespace {

constexpr const char* kOp = "tunedist.reduce_scatter_tensor";

template <typename Group>
void reduceScatterTensor(at::Tensor& output, const at::Tensor& input, std::string op, Group group) {
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = parseReduceOp(kOp, op);
  opts.asyncOp = false;
  at::Tensor in = input;
  waitFor(backendFor(kOp, group, output.device().type())->_reduce_scatter_base(output, in, opts));
}

template <typename Group>
void reduceScatterTensorMeta(at::Tensor& /*output*/, const at::Tensor& /*input*/, std::string /*op*/, Group /*group*/) {
}

}  // namespace

TUNEDIST_IMPL_BOTH_GROUPS("reduce_scatter_tensor_", reduceScatterTensor, reduceScatterTensorMeta)

}  // namespace tunedist::ops
