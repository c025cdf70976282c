// gather.
#include "backend/cpu/checks.h"
#include "backend/cpu/cpu_backend.h"

namespace tunedist::cpu {

c10::intrusive_ptr<c10d::Work> CpuBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                  std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  constexpr const char* kOp = "gather";
  const int root = int(opts.rootRank);
  guardCall(kOp, [&] {
    cpu::checkRoot(opts.rootRank, size_);
    TORCH_CHECK(inputs.size() == 1, "expects exactly one input, got ", inputs.size());
    cpu::checkCpuDense(inputs[0], "the input");
    if (rank_ == root) {
      TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == size_t(size_), "the root needs one output list of ",
                  size_, " tensors");
      for (const auto& o : outputs[0]) {
        cpu::checkCpuDense(o, "an output");
        cpu::checkLike(o, inputs[0], "an output");
      }
    } else {
      TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), "only the root (rank ", root,
                  ") takes an output list");
    }
  });
  at::Tensor in = inputs[0];
  std::vector<at::Tensor> outs = rank_ == root ? outputs[0] : std::vector<at::Tensor>{};
  const int rank = rank_;
  return launch(c10d::OpType::GATHER, "tuned:gather", outs, inputs, opts.asyncOp, opts.timeout, cpu::tensorBytes(in),
                [in, outs, root, rank](engine::HostCollectives& engine, const core::OpContext& ctx) {
                  at::Tensor src = cpu::unaliasedSource(cpu::staged(in), outs, rank);
                  std::vector<at::Tensor> staged;
                  staged.reserve(outs.size());
                  for (const auto& o : outs) {
                    staged.push_back(cpu::staged(o));
                  }
                  engine.gather(ctx, src, staged, root);
                  for (size_t p = 0; p < outs.size(); ++p) {
                    cpu::copyBack(outs[p], staged[p]);
                  }
                });
}

}  // namespace tunedist::cpu
