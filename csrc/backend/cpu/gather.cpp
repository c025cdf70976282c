// gather.
#include "backend/cpu/checks.h"
#include "backend/cpu/cpu_backend.h"

namespace tunedist {

c10::intrusive_ptr<c10d::Work> CpuBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                  std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  constexpr const char* kOp = "gather";
  const int root = int(opts.rootRank);
  guardCall(kOp, [&] {
    ops::checkRoot(opts.rootRank, size_);
    TORCH_CHECK(inputs.size() == 1, "expects exactly one input, got ", inputs.size());
    ops::checkCpuDense(inputs[0], "the input");
    if (rank_ == root) {
      TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == size_t(size_), "the root needs one output list of ",
                  size_, " tensors");
      for (const auto& o : outputs[0]) {
        ops::checkCpuDense(o, "an output");
        ops::checkLike(o, inputs[0], "an output");
      }
    } else {
      TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), "only the root (rank ", root,
                  ") takes an output list");
    }
  });
  at::Tensor in = inputs[0];
  std::vector<at::Tensor> outs = rank_ == root ? outputs[0] : std::vector<at::Tensor>{};
  const int rank = rank_;
  return launch(c10d::OpType::GATHER, "tuned:gather", outs, inputs, opts.asyncOp, opts.timeout, ops::tensorBytes(in),
                [in, outs, root, rank](HostCollectives& engine, const shm::OpContext& ctx) {
                  at::Tensor src = ops::unaliasedSource(ops::staged(in), outs, rank);
                  std::vector<at::Tensor> staged;
                  staged.reserve(outs.size());
                  for (const auto& o : outs) {
                    staged.push_back(ops::staged(o));
                  }
                  engine.gather(ctx, src, staged, root);
                  for (size_t p = 0; p < outs.size(); ++p) {
                    ops::copyBack(outs[p], staged[p]);
                  }
                });
}

}  // namespace tunedist
