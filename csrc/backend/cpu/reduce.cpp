// reduce.
#include "backend/cpu/checks.h"
#include "backend/cpu/cpu_backend.h"

namespace tunedist::cpu {

c10::intrusive_ptr<c10d::Work> CpuBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  constexpr const char* kOp = "reduce";
  kernels::ReduceArgs args;
  guardCall(kOp, [&] {
    TORCH_CHECK(tensors.size() == 1, "expects exactly one tensor, got ", tensors.size());
    cpu::checkCpuDense(tensors[0], "the tensor");
    cpu::checkRoot(opts.rootRank, size_);
    TORCH_CHECK(opts.rootTensor == 0, "rootTensor must be 0, got ", opts.rootTensor);
    args = cpu::reduceArgs(opts.reduceOp, tensors[0].scalar_type(), size_);
  });
  at::Tensor t = tensors[0];
  const int root = int(opts.rootRank);
  const int rank = rank_;
  return launch(c10d::OpType::REDUCE, "tuned:reduce", tensors, tensors, opts.asyncOp, opts.timeout, cpu::tensorBytes(t),
                [t, args, root, rank](engine::HostCollectives& engine, const core::OpContext& ctx) {
                  at::Tensor s = cpu::staged(t);
                  engine.reduce(ctx, s, args, root);
                  if (rank == root) {
                    cpu::copyBack(t, s);
                  }
                });
}

}  // namespace tunedist::cpu
