// torch.ops.tunedist.broadcast_: dist.broadcast(tensor, group_src=..., group=...), synchronously, without
// torch.distributed's Python layer (see all_reduce.cpp): the group's backend runs its broadcast from `group_src`, the
// root's rank in the group.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "ops/common.h"

namespace tunedist::ops {
namespace {

template <typename Group>
void broadcast(at::Tensor& tensor, int64_t groupSrc, Group group) {
  c10d::BroadcastOptions opts;
  opts.rootRank = groupSrc;
  opts.asyncOp = false;
  std::vector<at::Tensor> tensors{tensor};
  waitFor(backendFor("tunedist.broadcast", group, tensor.device().type())->broadcast(tensors, opts));
}

template <typename Group>
void broadcastMeta(at::Tensor& /*tensor*/, int64_t /*groupSrc*/, Group /*group*/) {}

}  // namespace

TUNEDIST_IMPL_BOTH_GROUPS("broadcast_", broadcast, broadcastMeta)

}  // namespace tunedist::ops
