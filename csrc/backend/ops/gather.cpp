// gather and scatter.
#include "backend/ops/common.h"

namespace tunedist {

c10::intrusive_ptr<c10d::Work> TunedBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs,
                                                    const c10d::GatherOptions& opts) {
  constexpr const char* kOp = "gather";
  if (auto* nccl = cudaSide(kOp, outputs, inputs)) {
    return nccl->gather(outputs, inputs, opts);
  }
  const int root = int(opts.rootRank);
  ops::guardCall(*this, kOp, [&] {
    TORCH_CHECK(root >= 0 && root < size_, kOp, ": root ", root, " is outside the group of ", size_);
    TORCH_CHECK(inputs.size() == 1, kOp, ": expects exactly one input, got ", inputs.size());
    ops::checkCpuDense(inputs[0], kOp, "the input");
    if (rank_ == root) {
      TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == size_t(size_), kOp,
                  ": the root needs one output list of ", size_, " tensors");
      for (const auto& o : outputs[0]) {
        ops::checkCpuDense(o, kOp, "an output");
        ops::checkLike(o, inputs[0], kOp, "an output");
      }
    } else {
      TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), kOp,
                  ": only the root (rank ", root, ") takes an output list");
    }
  });
  at::Tensor in = inputs[0];
  std::vector<at::Tensor> outs = rank_ == root ? outputs[0] : std::vector<at::Tensor>{};
  return launch(c10d::OpType::GATHER, "tuned:gather", outs, inputs, opts.asyncOp, opts.timeout,
                ops::tensorBytes(in), [this, in, outs, root](const shm::OpContext& ctx) {
                  at::Tensor src = ops::unaliasedSource(ops::staged(in), outs, rank_);
                  std::vector<at::Tensor> staged;
                  std::vector<void*> blocks(size_t(size_), nullptr);
                  for (size_t p = 0; p < outs.size(); ++p) {
                    staged.push_back(ops::staged(outs[p]));
                    blocks[p] = staged.back().data_ptr();
                  }
                  if (cross_) {
                    runHier(ctx, [&] { hier::gather(hierCtx(ctx), src, staged, root); });
                  } else {
                    comm_->gather(ctx, src.data_ptr(), ops::tensorBytes(src), blocks.data(), root);
                  }
                  for (size_t p = 0; p < outs.size(); ++p) {
                    ops::copyBack(outs[p], staged[p]);
                  }
                });
}

c10::intrusive_ptr<c10d::Work> TunedBackend::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ScatterOptions& opts) {
  constexpr const char* kOp = "scatter";
  if (auto* nccl = cudaSide(kOp, outputs, inputs)) {
    return nccl->scatter(outputs, inputs, opts);
  }
  const int root = int(opts.rootRank);
  ops::guardCall(*this, kOp, [&] {
    TORCH_CHECK(root >= 0 && root < size_, kOp, ": root ", root, " is outside the group of ", size_);
    TORCH_CHECK(outputs.size() == 1, kOp, ": expects exactly one output, got ", outputs.size());
    ops::checkCpuDense(outputs[0], kOp, "the output");
    if (rank_ == root) {
      TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == size_t(size_), kOp,
                  ": the root needs one input list of ", size_, " tensors");
      for (const auto& i : inputs[0]) {
        ops::checkCpuDense(i, kOp, "an input");
        ops::checkLike(i, outputs[0], kOp, "an input");
      }
    } else {
      TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), kOp,
                  ": only the root (rank ", root, ") takes an input list");
    }
  });
  at::Tensor out = outputs[0];
  std::vector<at::Tensor> ins = rank_ == root ? inputs[0] : std::vector<at::Tensor>{};
  return launch(c10d::OpType::SCATTER, "tuned:scatter", outputs, ins, opts.asyncOp, opts.timeout,
                ops::tensorBytes(out), [this, out, ins, root](const shm::OpContext& ctx) {
                  at::Tensor dst = ops::staged(out);
                  std::vector<at::Tensor> staged;
                  std::vector<const void*> blocks(size_t(size_), nullptr);
                  for (size_t p = 0; p < ins.size(); ++p) {
                    staged.push_back(ops::overlaps(ins[p], out) && int(p) != rank_ ? ins[p].clone()
                                                                                    : ops::staged(ins[p]));
                    blocks[p] = staged.back().data_ptr();
                  }
                  if (cross_) {
                    runHier(ctx, [&] { hier::scatter(hierCtx(ctx), staged, dst, root); });
                  } else {
                    comm_->scatter(ctx, blocks.data(), dst.data_ptr(), ops::tensorBytes(dst), root);
                  }
                  ops::copyBack(out, dst);
                });
}

}  // namespace tunedist
