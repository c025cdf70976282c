// reduce_scatter (list), reduce_scatter_tensor (_reduce_scatter_base) and its coalesced form.
#include "backend/ops/common.h"

namespace tunedist {
namespace {

// Reduces block p of every rank into rank p's `out`. Blocks are contiguous staged copies where needed; the
// output may be our own input block (checked by pointer equality in the engine's element-wise reduce).
void reduceScatterBlocks(TunedBackend& backend, const shm::OpContext& ctx, const std::vector<at::Tensor>& blocks,
                         const at::Tensor& out, const shm::ReduceArgs& args) {
  if (backend.crossHost() != nullptr) {
    // Across hosts: the hierarchical all-reduce of every block, then our own block.
    std::vector<at::Tensor> flat;
    for (const auto& b : blocks) {
      flat.push_back(b.reshape({-1}));
    }
    at::Tensor all = at::cat(flat);
    backend.runHier(ctx, [&] { hier::allreduce(backend.hierCtx(ctx), all, args); });
    out.copy_(all.narrow(0, int64_t(backend.rank()) * out.numel(), out.numel()).view(out.sizes()));
    return;
  }
  shm::ShmComm& comm = backend.comm();
  std::vector<at::Tensor> staged;
  std::vector<const void*> ptrs;
  at::Tensor dst = ops::staged(out);
  for (size_t p = 0; p < blocks.size(); ++p) {
    bool exactOwn = int(p) == comm.rank() && blocks[p].data_ptr() == dst.data_ptr() && blocks[p].is_contiguous();
    bool clash = !exactOwn && ops::overlaps(blocks[p], dst);
    staged.push_back(clash ? blocks[p].contiguous().clone() : ops::staged(blocks[p]));
    ptrs.push_back(staged.back().data_ptr());
  }
  comm.reduceScatter(ctx, ptrs.data(), dst.data_ptr(), size_t(dst.numel()), args);
  ops::copyBack(out, dst);
}

std::vector<at::Tensor> chunksOf(const at::Tensor& input, int size) {
  at::Tensor flat = input.reshape({-1});
  int64_t n = flat.numel() / size;
  std::vector<at::Tensor> blocks;
  for (int p = 0; p < size; ++p) {
    blocks.push_back(flat.narrow(0, int64_t(p) * n, n));
  }
  return blocks;
}

void checkReduceScatterBase(const at::Tensor& out, const at::Tensor& in, int size, const char* op) {
  ops::checkCpuDense(in, op, "the input");
  ops::checkCpuDense(out, op, "the output");
  TORCH_CHECK(out.scalar_type() == in.scalar_type(), op, ": output dtype ", out.scalar_type(),
              " differs from input dtype ", in.scalar_type());
  TORCH_CHECK(in.numel() == out.numel() * size, op, ": the input has ", in.numel(),
              " elements; expected output size ", out.numel(), " x group size ", size);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> TunedBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ReduceScatterOptions& opts) {
  constexpr const char* kOp = "reduce_scatter";
  if (auto* nccl = cudaSide(kOp, outputs, inputs)) {
    return nccl->reduce_scatter(outputs, inputs, opts);
  }
  shm::ReduceArgs args;
  ops::guardCall(*this, kOp, [&] {
    TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1, kOp, ": expects one output and one input list");
    TORCH_CHECK(inputs[0].size() == size_t(size_), kOp, ": the input list has ", inputs[0].size(),
                " tensors for a group of ", size_);
    ops::checkCpuDense(outputs[0], kOp, "the output");
    for (const auto& i : inputs[0]) {
      ops::checkCpuDense(i, kOp, "an input");
      ops::checkLike(i, outputs[0], kOp, "an input");
    }
    args = ops::reduceArgs(opts.reduceOp, outputs[0].scalar_type(), size_, kOp);
  });
  at::Tensor out = outputs[0];
  std::vector<at::Tensor> blocks = inputs[0];
  return launch(c10d::OpType::REDUCE_SCATTER, "tuned:reduce_scatter", outputs, blocks, opts.asyncOp, opts.timeout,
                ops::tensorBytes(out) * size_t(size_), [this, out, blocks, args](const shm::OpContext& ctx) {
                  reduceScatterBlocks(*this, ctx, blocks, out, args);
                });
}

c10::intrusive_ptr<c10d::Work> TunedBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts) {
  constexpr const char* kOp = "reduce_scatter_tensor";
  if (auto* nccl = cudaSide(kOp, output, input)) {
    return nccl->_reduce_scatter_base(output, input, opts);
  }
  shm::ReduceArgs args;
  ops::guardCall(*this, kOp, [&] {
    checkReduceScatterBase(output, input, size_, kOp);
    args = ops::reduceArgs(opts.reduceOp, output.scalar_type(), size_, kOp);
  });
  at::Tensor out = output;
  at::Tensor in = input;
  return launch(c10d::OpType::_REDUCE_SCATTER_BASE, "tuned:reduce_scatter_tensor", {out}, {in}, opts.asyncOp,
                opts.timeout, ops::tensorBytes(in), [this, out, in, args](const shm::OpContext& ctx) {
                  reduceScatterBlocks(*this, ctx, chunksOf(in, size_), out, args);
                });
}

c10::intrusive_ptr<c10d::Work> TunedBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  constexpr const char* kOp = "reduce_scatter_tensor_coalesced";
  if (auto* nccl = cudaSide(kOp, outputs, inputs)) {
    return nccl->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  }
  std::vector<shm::ReduceArgs> args;
  size_t bytes = 0;
  ops::guardCall(*this, kOp, [&] {
    TORCH_CHECK(outputs.size() == inputs.size(), kOp, ": ", outputs.size(), " outputs for ", inputs.size(),
                " inputs");
    for (size_t i = 0; i < inputs.size(); ++i) {
      checkReduceScatterBase(outputs[i], inputs[i], size_, kOp);
      args.push_back(ops::reduceArgs(opts.reduceOp, outputs[i].scalar_type(), size_, kOp));
      bytes += ops::tensorBytes(inputs[i]);
    }
  });
  std::vector<at::Tensor> outs = outputs;
  std::vector<at::Tensor> ins = inputs;
  return launch(c10d::OpType::COALESCED, "tuned:reduce_scatter_tensor_coalesced", outs, ins,
                opts.asyncOp, opts.timeout, bytes, [this, outs, ins, args](const shm::OpContext& ctx) {
                  for (size_t i = 0; i < ins.size(); ++i) {
                    reduceScatterBlocks(*this, ctx, chunksOf(ins[i], size_), outs[i], args[i]);
                  }
                });
}

}  // namespace tunedist
