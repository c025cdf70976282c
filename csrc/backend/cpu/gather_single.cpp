// gather_single (dist.gather_single, and its older name gather_into_tensor): every rank's input into one flat output
// on the root, rank p's block at [p * n, (p + 1) * n). The blocks are consecutive slices of the output, so the engine's
// gather writes them in place, as all_gather_into_tensor does.
#include "backend/cpu/checks.h"
#include "backend/cpu/cpu_backend.h"

namespace tunedist::cpu {

c10::intrusive_ptr<c10d::Work> CpuBackend::gatherSingle(at::Tensor& output, at::Tensor& input,
                                                        const c10d::GatherOptions& opts) {
  constexpr const char* kOp = "gather_single";
  const int root = int(opts.rootRank);
  guardCall(kOp, [&] {
    cpu::checkRoot(opts.rootRank, size_);
    cpu::checkCpuDense(input, "the input");
    if (rank_ == root) {
      cpu::checkCpuDense(output, "the output");
      // As torch's NCCL backends: only the element count is checked (a flat or a stacked output), and the output
      // must be contiguous (a strided view raises instead of being staged).
      TORCH_CHECK(output.is_contiguous(), "the output on the root (rank ", root, ") must be contiguous");
      TORCH_CHECK(output.scalar_type() == input.scalar_type(), "output dtype ", output.scalar_type(),
                  " differs from input dtype ", input.scalar_type());
      TORCH_CHECK(output.numel() == input.numel() * size_, "the output has ", output.numel(),
                  " elements; expected input size ", input.numel(), " x group size ", size_);
    }
  });
  at::Tensor in = input;
  // Only the root's output is written; elsewhere torch passes an empty placeholder.
  std::vector<at::Tensor> outs = rank_ == root ? cpu::flatSlices(output, size_) : std::vector<at::Tensor>{};
  std::vector<at::Tensor> workOutputs = rank_ == root ? std::vector<at::Tensor>{output} : std::vector<at::Tensor>{};
  const int rank = rank_;
  return launch(c10d::OpType::GATHER, "tuned:gather_single", std::move(workOutputs), {input}, opts.asyncOp,
                opts.timeout, cpu::tensorBytes(in),
                [in, outs, root, rank](engine::HostCollectives& engine, const core::OpContext& ctx) {
                  engine.gather(ctx, cpu::unaliasedSource(cpu::staged(in), outs, rank), outs, root);
                });
}

}  // namespace tunedist::cpu
