// broadcast.
#include "backend/cpu/checks.h"
#include "backend/cpu/cpu_backend.h"

namespace tunedist {

c10::intrusive_ptr<c10d::Work> CpuBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                     const c10d::BroadcastOptions& opts) {
  constexpr const char* kOp = "broadcast";
  guardCall(kOp, [&] {
    TORCH_CHECK(tensors.size() == 1, "expects exactly one tensor, got ", tensors.size());
    ops::checkCpuDense(tensors[0], "the tensor");
    ops::checkRoot(opts.rootRank, size_);
    TORCH_CHECK(opts.rootTensor == 0, "rootTensor must be 0, got ", opts.rootTensor);
  });
  at::Tensor t = tensors[0];
  const int root = int(opts.rootRank);
  const int rank = rank_;
  return launch(c10d::OpType::BROADCAST, "tuned:broadcast", tensors, tensors, opts.asyncOp, opts.timeout,
                ops::tensorBytes(t), [t, root, rank](HostCollectives& engine, const shm::OpContext& ctx) {
                  at::Tensor s = ops::staged(t);
                  engine.broadcast(ctx, s, root);
                  if (rank != root) {
                    ops::copyBack(t, s);
                  }
                });
}

}  // namespace tunedist
