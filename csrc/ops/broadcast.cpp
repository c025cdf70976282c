// torch.ops.tunedist.broadcast_: dist.broadcast(tensor, group_src=..., group=...), synchronously, without
// torch.distributed's Python layer (see all_reduce.cpp): the group's backend runs its broadcast from `group_src`, the
// root's rank in the group.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "ops/common.h"

namespace tunedist::direct {
namespace {

void broadcast(at::Tensor& tensor, int64_t groupSrc, std::string groupName) {
  c10d::BroadcastOptions opts;
  opts.rootRank = groupSrc;
  opts.asyncOp = false;
  std::vector<at::Tensor> tensors{tensor};
  waitFor(backendFor("tunedist.broadcast", groupName, tensor.device().type())->broadcast(tensors, opts));
}

void broadcastMeta(at::Tensor& /*tensor*/, int64_t /*groupSrc*/, std::string /*groupName*/) {}

}  // namespace

TORCH_LIBRARY_IMPL(tunedist, CPU, m) { m.impl("broadcast_", broadcast); }
TORCH_LIBRARY_IMPL(tunedist, CUDA, m) { m.impl("broadcast_", broadcast); }
TORCH_LIBRARY_IMPL(tunedist, Meta, m) { m.impl("broadcast_", broadcastMeta); }

}  // namespace tunedist::direct
