// scatter.
#include "backend/cpu/checks.h"
#include "backend/cpu/cpu_backend.h"

namespace tunedist::cpu {

c10::intrusive_ptr<c10d::Work> CpuBackend::scatter(std::vector<at::Tensor>& outputs,
                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                   const c10d::ScatterOptions& opts) {
  constexpr const char* kOp = "scatter";
  const int root = int(opts.rootRank);
  guardCall(kOp, [&] {
    cpu::checkRoot(opts.rootRank, size_);
    TORCH_CHECK(outputs.size() == 1, "expects exactly one output, got ", outputs.size());
    cpu::checkCpuDense(outputs[0], "the output");
    if (rank_ == root) {
      TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == size_t(size_), "the root needs one input list of ", size_,
                  " tensors");
      for (const auto& i : inputs[0]) {
        cpu::checkCpuDense(i, "an input");
        cpu::checkLike(i, outputs[0], "an input");
      }
    } else {
      TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), "only the root (rank ", root,
                  ") takes an input list");
    }
  });
  at::Tensor out = outputs[0];
  std::vector<at::Tensor> ins = rank_ == root ? inputs[0] : std::vector<at::Tensor>{};
  const int rank = rank_;
  return launch(c10d::OpType::SCATTER, "tuned:scatter", outputs, ins, opts.asyncOp, opts.timeout, cpu::tensorBytes(out),
                [out, ins, root, rank](engine::HostCollectives& engine, const core::OpContext& ctx) {
                  at::Tensor dst = cpu::staged(out);
                  // A peer's block that overlaps our output is read from a copy: the output is written first.
                  std::vector<at::Tensor> staged;
                  staged.reserve(ins.size());
                  for (size_t p = 0; p < ins.size(); ++p) {
                    staged.push_back(cpu::overlaps(ins[p], out) && int(p) != rank ? ins[p].clone()
                                                                                  : cpu::staged(ins[p]));
                  }
                  engine.scatter(ctx, staged, dst, root);
                  cpu::copyBack(out, dst);
                });
}

}  // namespace tunedist::cpu
