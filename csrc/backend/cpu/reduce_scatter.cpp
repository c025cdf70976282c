// reduce_scatter (list), reduce_scatter_tensor (_reduce_scatter_base) and its coalesced form.
#include "backend/cpu/checks.h"
#include "backend/cpu/cpu_backend.h"

namespace tunedist::cpu {
namespace {

// Reduces block p of every rank into rank p's `out` (staged here when not contiguous). The engine handles blocks
// that alias the output.
void reduceScatterInto(engine::HostCollectives& engine, const core::OpContext& ctx,
                       const std::vector<at::Tensor>& blocks, const at::Tensor& out, const kernels::ReduceArgs& args) {
  at::Tensor dst = cpu::staged(out);
  engine.reduceScatter(ctx, blocks, dst, args);
  cpu::copyBack(out, dst);
}

std::vector<at::Tensor> chunksOf(const at::Tensor& input, int size) {
  return cpu::flatSlices(cpu::staged(input), size);
}

void checkReduceScatterBase(const at::Tensor& out, const at::Tensor& in, int size) {
  cpu::checkCpuDense(in, "the input");
  cpu::checkCpuDense(out, "the output");
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
  kernels::ReduceArgs args;
  guardCall(kOp, [&] {
    TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1, "expects one output and one input list");
    TORCH_CHECK(inputs[0].size() == size_t(size_), "the input list has ", inputs[0].size(), " tensors for a group of ",
                size_);
    cpu::checkCpuDense(outputs[0], "the output");
    for (const auto& i : inputs[0]) {
      cpu::checkCpuDense(i, "an input");
      cpu::checkLike(i, outputs[0], "an input");
    }
    args = cpu::reduceArgs(opts.reduceOp, outputs[0].scalar_type(), size_);
  });
  at::Tensor out = outputs[0];
  std::vector<at::Tensor> blocks = inputs[0];
  return launch(c10d::OpType::REDUCE_SCATTER, "tuned:reduce_scatter", outputs, blocks, opts.asyncOp, opts.timeout,
                cpu::tensorBytes(out) * size_t(size_),
                [out, blocks, args](engine::HostCollectives& engine, const core::OpContext& ctx) {
                  reduceScatterInto(engine, ctx, blocks, out, args);
                });
}

c10::intrusive_ptr<c10d::Work> CpuBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::ReduceScatterOptions& opts) {
  constexpr const char* kOp = "reduce_scatter_tensor";
  kernels::ReduceArgs args;
  guardCall(kOp, [&] {
    checkReduceScatterBase(output, input, size_);
    args = cpu::reduceArgs(opts.reduceOp, output.scalar_type(), size_);
  });
  at::Tensor out = output;
  at::Tensor in = input;
  const int size = size_;
  return launch(c10d::OpType::_REDUCE_SCATTER_BASE, "tuned:reduce_scatter_tensor", {out}, {in}, opts.asyncOp,
                opts.timeout, cpu::tensorBytes(in),
                [out, in, args, size](engine::HostCollectives& engine, const core::OpContext& ctx) {
                  reduceScatterInto(engine, ctx, chunksOf(in, size), out, args);
                });
}

c10::intrusive_ptr<c10d::Work> CpuBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                           std::vector<at::Tensor>& inputs,
                                                                           const c10d::ReduceScatterOptions& opts) {
  constexpr const char* kOp = "reduce_scatter_tensor_coalesced";
  std::vector<kernels::ReduceArgs> args;
  size_t bytes = 0;
  guardCall(kOp, [&] {
    TORCH_CHECK(outputs.size() == inputs.size(), outputs.size(), " outputs for ", inputs.size(), " inputs");
    for (size_t i = 0; i < inputs.size(); ++i) {
      checkReduceScatterBase(outputs[i], inputs[i], size_);
      args.push_back(cpu::reduceArgs(opts.reduceOp, outputs[i].scalar_type(), size_));
      bytes += cpu::tensorBytes(inputs[i]);
    }
  });
  std::vector<at::Tensor> outs = outputs;
  std::vector<at::Tensor> ins = inputs;
  const int size = size_;
  return launch(c10d::OpType::COALESCED, "tuned:reduce_scatter_tensor_coalesced", outs, ins, opts.asyncOp, opts.timeout,
                bytes, [outs, ins, args, size](engine::HostCollectives& engine, const core::OpContext& ctx) {
                  for (size_t i = 0; i < ins.size(); ++i) {
                    reduceScatterInto(engine, ctx, chunksOf(ins[i], size), outs[i], args[i]);
                  }
                });
}

}  // namespace tunedist::cpu
