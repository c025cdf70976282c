// torch.ops.tunedist.all_reduce_: a synchronous, in-place all_reduce on a process group named as torch's functional
// collectives name it (ProcessGroup.group_name), for callers that want DeepSpeed's inference_all_reduce calling
// convention: a tensor-parallel layer on CPU, called once per layer per token.
//
// Why a second door: torch.distributed.all_reduce runs about 4.8 us of Python and c10d dispatch per call on this
// project's 2-vCPU VM before a backend sees the tensor (torch's fake process group, which does nothing, costs that
// much), while calling a torch operator from Python costs about 1.3 us. At 4-16 KiB that floor is most of a call.
// This operator goes from the dispatcher straight to the group's backend for the tensor's device, so a `tuned` group
// runs the same engine, with the same sequence numbers, descriptor checks and errors, as dist.all_reduce on it (the
// two may be mixed in any order); any other backend (gloo, nccl) works too, through its own allreduce.
//
//   torch.ops.tunedist.all_reduce_(tensor, "sum", group.group_name)   # returns None
//   tunedist.all_reduce(tensor)                                        # the same on the world; returns tensor
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/library.h>

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "backend/tuned_backend.h"

namespace tunedist {
namespace {

constexpr const char* kOp = "tunedist.all_reduce";

c10d::ReduceOp parseReduceOp(const std::string& name) {
  static const std::array<std::pair<const char*, c10d::ReduceOp::RedOpType>, 8> kOps{{
      {"sum", c10d::ReduceOp::SUM},
      {"avg", c10d::ReduceOp::AVG},
      {"product", c10d::ReduceOp::PRODUCT},
      {"min", c10d::ReduceOp::MIN},
      {"max", c10d::ReduceOp::MAX},
      {"band", c10d::ReduceOp::BAND},
      {"bor", c10d::ReduceOp::BOR},
      {"bxor", c10d::ReduceOp::BXOR},
  }};
  for (const auto& [text, op] : kOps) {
    if (name == text) {
      return c10d::ReduceOp(op);
    }
  }
  TORCH_CHECK(false, kOp, ": unknown reduce op '", name,
              "'; use sum, avg, product, min, max, band, bor or bxor (PREMUL_SUM: use torch.distributed.all_reduce)");
}

void allReduceInPlace(at::Tensor& tensor, std::string op, std::string groupName) {
  c10d::AllreduceOptions opts;
  opts.reduceOp = parseReduceOp(op);
  opts.asyncOp = false;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  try {
    group = c10d::resolve_process_group(groupName);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, kOp, ": no process group is registered under the name '", groupName,
                "' in this process (pass group.group_name of a live group; tunedist.all_reduce does): ",
                e.what_without_backtrace());
  }
  // The backend that dist.all_reduce would reach for this tensor (c10d's allreduce_ op on this device type). A tuned
  // one runs the call without a Work where it can; under TORCH_DISTRIBUTED_DEBUG=DETAIL it is wrapped (torch's
  // ProcessGroupWrapper, which checks the call against the peers first) and goes the general way.
  auto backend = group->getBackend(tensor.device().type());
  if (auto* tuned = dynamic_cast<TunedBackend*>(backend.get())) {
    tuned->allreduceNow(tensor, opts);
    return;
  }
  std::vector<at::Tensor> tensors{tensor};
  backend->allreduce(tensors, opts)->wait();
}

// Shapes only (torch.compile's fake tensors, the meta device): nothing to compute, the tensor is written in place.
void allReduceMeta(at::Tensor& /*tensor*/, std::string /*op*/, std::string /*groupName*/) {}

}  // namespace

TORCH_LIBRARY(tunedist, m) {
  // Returns nothing: a custom operator that mutates its input and returns no alias of it is one that torch.compile
  // can functionalize (it cannot for an aliased output: "-> Tensor(a!)").
  m.def("all_reduce_(Tensor(a!) tensor, str op, str group_name) -> ()");
}

TORCH_LIBRARY_IMPL(tunedist, CPU, m) { m.impl("all_reduce_", allReduceInPlace); }
TORCH_LIBRARY_IMPL(tunedist, CUDA, m) { m.impl("all_reduce_", allReduceInPlace); }
TORCH_LIBRARY_IMPL(tunedist, Meta, m) { m.impl("all_reduce_", allReduceMeta); }

}  // namespace tunedist
