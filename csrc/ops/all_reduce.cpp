// torch.ops.tunedist.all_reduce_: a synchronous, in-place all_reduce on a process group named as torch's functional
// collectives name it (ProcessGroup.group_name), for callers that want DeepSpeed's inference_all_reduce calling
// convention: a tensor-parallel layer on CPU, called once per layer per token.
//
// Why a second door: torch.distributed.all_reduce runs about 4.8 us of Python and c10d dispatch per call on a
// 2-vCPU AMD EPYC before a backend sees the tensor (torch's fake process group, which does nothing, costs that
// much), while calling a torch operator from Python costs about 1.3 us. At 4-16 KiB that floor is most of a call
// (docs/performance.md#the-per-call-budget-and-the-direct-operators).
// This operator goes from the dispatcher straight to the group's backend for the tensor's device, so a `tuned` group
// runs the same engine, with the same sequence numbers, descriptor checks and errors, as dist.all_reduce on it (the
// two may be mixed in any order); any other backend (gloo, nccl) works too, through its own allreduce.
//
//   torch.ops.tunedist.all_reduce_(tensor, "sum", group.group_name)   # returns None
//   tunedist.all_reduce(tensor)                                        # the same on the world; returns tensor
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "ops/common.h"

namespace tunedist::ops {
namespace {

constexpr const char* kOp = "tunedist.all_reduce";

// What dist.all_reduce does with a complex tensor: SUM and AVG act on its real and imaginary parts alike, so the
// backend gets them as a real tensor of twice the elements (torch.view_as_real); the order-based and bitwise ops are
// refused before the group sees the call.
at::Tensor realView(const at::Tensor& tensor, const c10d::ReduceOp& op, const std::string& name) {
  if (!tensor.is_complex()) {
    return tensor;
  }
  TORCH_CHECK(op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG, kOp, ": reduce op '", name,
              "' is not supported on complex tensors (", tensor.scalar_type(), "); use sum or avg");
  return at::view_as_real(tensor);
}

template <typename Group>
void allReduce(at::Tensor& tensor, std::string op, Group group) {
  c10d::AllreduceOptions opts;
  opts.reduceOp = parseReduceOp(kOp, op);
  opts.asyncOp = false;
  at::Tensor t = realView(tensor, opts.reduceOp, op);
  std::vector<at::Tensor> tensors{t};
  // A tuned group runs a synchronous call that finds nothing queued on this thread and returns no Work for it
  // (cpu::Executor::Options::syncReturnsWork).
  waitFor(backendFor(kOp, group, t.device().type())->allreduce(tensors, opts));
}

// Shapes only (torch.compile's fake tensors, the meta device): nothing to compute, the tensor is written in place.
template <typename Group>
void allReduceMeta(at::Tensor& /*tensor*/, std::string /*op*/, Group /*group*/) {}

}  // namespace

TUNEDIST_IMPL_BOTH_GROUPS("all_reduce_", allReduce, allReduceMeta)

}  // namespace tunedist::ops
