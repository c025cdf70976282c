// all_reduce and all_reduce_coalesced.
#include "backend/cpu/checks.h"
#include "backend/cpu/cpu_backend.h"

namespace tunedist::cpu {

c10::intrusive_ptr<c10d::Work> CpuBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceOptions& opts) {
  constexpr const char* kOp = "all_reduce";
  if (tensors.size() == 1 && tensors[0].layout() == c10::kSparse) {
    return allreduceSparse(tensors, opts);
  }
  kernels::ReduceArgs args;
  guardCall(kOp, [&] {
    TORCH_CHECK(tensors.size() == 1, "expects exactly one tensor, got ", tensors.size());
    cpu::checkCpuDense(tensors[0], "the tensor");
    args = cpu::reduceArgs(opts.reduceOp, tensors[0].scalar_type(), size_);
  });
  at::Tensor t = tensors[0];
  return launch(c10d::OpType::ALLREDUCE, "tuned:all_reduce", tensors, tensors, opts.asyncOp, opts.timeout,
                cpu::tensorBytes(t), [t, args](engine::HostCollectives& engine, const core::OpContext& ctx) {
                  at::Tensor s = cpu::staged(t);
                  engine.allreduce(ctx, s, args);
                  cpu::copyBack(t, s);
                });
}

// The tensors travel as one flat buffer per call: one synchronisation for all of them instead of one each.
c10::intrusive_ptr<c10d::Work> CpuBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceCoalescedOptions& opts) {
  constexpr const char* kOp = "all_reduce_coalesced";
  kernels::ReduceArgs args;
  size_t bytes = 0;
  guardCall(kOp, [&] {
    TORCH_CHECK(!tensors.empty(), "expects at least one tensor");
    for (const auto& t : tensors) {
      cpu::checkCpuDense(t, "a tensor");
      TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), "all tensors must have one dtype, got ",
                  tensors[0].scalar_type(), " and ", t.scalar_type());
      bytes += cpu::tensorBytes(t);
    }
    args = cpu::reduceArgs(opts.reduceOp, tensors[0].scalar_type(), size_);
  });
  std::vector<at::Tensor> ts = tensors;
  return launch(c10d::OpType::ALLREDUCE_COALESCED, "tuned:all_reduce_coalesced", tensors, tensors, opts.asyncOp,
                opts.timeout, bytes, [ts, args](engine::HostCollectives& engine, const core::OpContext& ctx) {
                  std::vector<at::Tensor> flat;
                  flat.reserve(ts.size());
                  for (const auto& t : ts) {
                    flat.push_back(t.reshape({-1}));
                  }
                  at::Tensor buf = at::cat(flat);
                  engine.allreduce(ctx, buf, args);
                  int64_t off = 0;
                  for (const auto& t : ts) {
                    t.copy_(buf.narrow(0, off, t.numel()).view(t.sizes()));
                    off += t.numel();
                  }
                });
}

}  // namespace tunedist::cpu
