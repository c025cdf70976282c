// broadcast.
#include "backend/cpu/checks.h"
#include "backend/cpu/cpu_backend.h"

namespace tunedist::cpu {

c10::intrusive_ptr<c10d::Work> CpuBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                     const c10d::BroadcastOptions& opts) {
  constexpr const char* kOp = "broadcast";
  guardCall(kOp, [&] {
    TORCH_CHECK(tensors.size() == 1, "expects exactly one tensor, got ", tensors.size());
    cpu::checkCpuDense(tensors[0], "the tensor");
    cpu::checkRoot(opts.rootRank, size_);
    TORCH_CHECK(opts.rootTensor == 0, "rootTensor must be 0, got ", opts.rootTensor);
  });
  at::Tensor t = tensors[0];
  const int root = int(opts.rootRank);
  const int rank = rank_;
  return launch(c10d::OpType::BROADCAST, "tuned:broadcast", tensors, tensors, opts.asyncOp, opts.timeout,
                cpu::tensorBytes(t), [t, root, rank](engine::HostCollectives& engine, const core::OpContext& ctx) {
                  at::Tensor s = cpu::staged(t);
                  engine.broadcast(ctx, s, root);
                  if (rank != root) {
                    cpu::copyBack(t, s);
                  }
                });
}

}  // namespace tunedist::cpu
