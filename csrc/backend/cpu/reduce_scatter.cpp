// reduce_scatter (list), reduce_scatter_tensor (_reduce_scatter_base) and its coalesced form.
#include "backend/cpu/checks.h"
#include "backend/cpu/cpu_backend.h"

namespace tunedist {
namespace {

// Reduces block p of every rank into rank p's `out` (staged here when not contiguous). The engine handles blocks
// that alias the output.
void reduceScatterInto(HostCollectives& engine, const shm::OpContext& ctx, const std::vector<at::Tensor>& blocks,
                       const at::Tensor& out, const shm::ReduceArgs& args) {
  at::Tensor dst = ops::staged(out);
  engine.reduceScatter(ctx, blocks, dst, args);
  ops::copyBack(out, dst);
}

std::vector<at::Tensor> chunksOf(const at::Tensor& input, int size) {
  return ops::flatSlices(ops::staged(input), size);
}

void checkReduceScatterBase(const at::Tensor& out, const at::Tensor& in, int size) {
  ops::checkCpuDense(in, "the input");
  ops::checkCpuDense(out, "the output");
  TORCH_CHECK(out.scalar_type() == in.scalar_type(), "output dtype ", out.scalar_type(), " differs from input dtype ",
              in.scalar_type());
  TORCH_CHECK(in.numel() == out.numel() * size, "the input has ", in.numel(), " elements; expected output size ",
              out.numel(), " x group size ", size);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> CpuBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ReduceScatterOptions& opts) {
  constexpr const char* kOp = "reduce_scatter";
  shm::ReduceArgs args;
  guardCall(kOp, [&] {
    TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1, "expects one output and one input list");
    TORCH_CHECK(inputs[0].size() == size_t(size_), "the input list has ", inputs[0].size(), " tensors for a group of ",
                size_);
    ops::checkCpuDense(outputs[0], "the output");
    for (const auto& i : inputs[0]) {
      ops::checkCpuDense(i, "an input");
      ops::checkLike(i, outputs[0], "an input");
    }
    args = ops::reduceArgs(opts.reduceOp, outputs[0].scalar_type(), size_);
  });
  at::Tensor out = outputs[0];
  std::vector<at::Tensor> blocks = inputs[0];
  return launch(c10d::OpType::REDUCE_SCATTER, "tuned:reduce_scatter", outputs, blocks, opts.asyncOp, opts.timeout,
                ops::tensorBytes(out) * size_t(size_),
                [out, blocks, args](HostCollectives& engine, const shm::OpContext& ctx) {
                  reduceScatterInto(engine, ctx, blocks, out, args);
                });
}

c10::intrusive_ptr<c10d::Work> CpuBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::ReduceScatterOptions& opts) {
  constexpr const char* kOp = "reduce_scatter_tensor";
  shm::ReduceArgs args;
  guardCall(kOp, [&] {
    checkReduceScatterBase(output, input, size_);
    args = ops::reduceArgs(opts.reduceOp, output.scalar_type(), size_);
  });
  at::Tensor out = output;
  at::Tensor in = input;
  const int size = size_;
  return launch(c10d::OpType::_REDUCE_SCATTER_BASE, "tuned:reduce_scatter_tensor", {out}, {in}, opts.asyncOp,
                opts.timeout, ops::tensorBytes(in),
                [out, in, args, size](HostCollectives& engine, const shm::OpContext& ctx) {
                  reduceScatterInto(engine, ctx, chunksOf(in, size), out, args);
                });
}

c10::intrusive_ptr<c10d::Work> CpuBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                           std::vector<at::Tensor>& inputs,
                                                                           const c10d::ReduceScatterOptions& opts) {
  constexpr const char* kOp = "reduce_scatter_tensor_coalesced";
  std::vector<shm::ReduceArgs> args;
  size_t bytes = 0;
  guardCall(kOp, [&] {
    TORCH_CHECK(outputs.size() == inputs.size(), outputs.size(), " outputs for ", inputs.size(), " inputs");
    for (size_t i = 0; i < inputs.size(); ++i) {
      checkReduceScatterBase(outputs[i], inputs[i], size_);
      args.push_back(ops::reduceArgs(opts.reduceOp, outputs[i].scalar_type(), size_));
      bytes += ops::tensorBytes(inputs[i]);
    }
  });
  std::vector<at::Tensor> outs = outputs;
  std::vector<at::Tensor> ins = inputs;
  const int size = size_;
  return launch(c10d::OpType::COALESCED, "tuned:reduce_scatter_tensor_coalesced", outs, ins, opts.asyncOp, opts.timeout,
                bytes, [outs, ins, args, size](HostCollectives& engine, const shm::OpContext& ctx) {
                  for (size_t i = 0; i < ins.size(); ++i) {
                    reduceScatterInto(engine, ctx, chunksOf(ins[i], size), outs[i], args[i]);
                  }
                });
}

}  // namespace tunedist
