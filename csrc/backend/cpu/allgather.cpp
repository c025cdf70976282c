// all_gather (list), all_gather_into_tensor (_allgather_base) and their coalesced forms.
#include "backend/cpu/checks.h"
#include "backend/cpu/cpu_backend.h"

namespace tunedist::cpu {
namespace {

// Gathers `in` from every rank into the caller's blocks (one per rank; staged here when not contiguous). See
// cpu::unaliasedSource for an input that is a view into the output.
void allgatherInto(engine::HostCollectives& engine, const core::OpContext& ctx, const at::Tensor& in,
                   const std::vector<at::Tensor>& outs, int rank) {
  std::vector<at::Tensor> staged;
  staged.reserve(outs.size());
  for (const auto& o : outs) {
    staged.push_back(cpu::staged(o));
  }
  engine.allgather(ctx, cpu::unaliasedSource(cpu::staged(in), staged, rank), staged);
  for (size_t p = 0; p < outs.size(); ++p) {
    cpu::copyBack(outs[p], staged[p]);
  }
}

// all_gather_into_tensor: the blocks are consecutive slices of the (staged) output.
void allgatherBase(engine::HostCollectives& engine, const core::OpContext& ctx, const at::Tensor& out,
                   const at::Tensor& in, int rank, int size) {
  at::Tensor s = cpu::staged(out);
  std::vector<at::Tensor> blocks = cpu::flatSlices(s, size);
  engine.allgather(ctx, cpu::unaliasedSource(cpu::staged(in), blocks, rank), blocks);
  cpu::copyBack(out, s);
}

void checkAllgatherBase(const at::Tensor& out, const at::Tensor& in, int size) {
  cpu::checkCpuDense(in, "the input");
  cpu::checkCpuDense(out, "the output");
  TORCH_CHECK(out.scalar_type() == in.scalar_type(), "output dtype ", out.scalar_type(), " differs from input dtype ",
              in.scalar_type());
  TORCH_CHECK(out.numel() == in.numel() * size, "the output has ", out.numel(), " elements; expected input size ",
              in.numel(), " x group size ", size);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> CpuBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) {
  constexpr const char* kOp = "all_gather";
  guardCall(kOp, [&] {
    TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1, "expects one input and one output list");
    TORCH_CHECK(outputs[0].size() == size_t(size_), "the output list has ", outputs[0].size(),
                " tensors for a group of ", size_);
    cpu::checkCpuDense(inputs[0], "the input");
    for (const auto& o : outputs[0]) {
      cpu::checkCpuDense(o, "an output");
      cpu::checkLike(o, inputs[0], "an output");
    }
  });
  at::Tensor in = inputs[0];
  std::vector<at::Tensor> outs = outputs[0];
  const int rank = rank_;
  return launch(c10d::OpType::ALLGATHER, "tuned:all_gather", outs, inputs, opts.asyncOp, opts.timeout,
                cpu::tensorBytes(in) * size_t(size_),
                [in, outs, rank](engine::HostCollectives& engine, const core::OpContext& ctx) {
                  allgatherInto(engine, ctx, in, outs, rank);
                });
}

c10::intrusive_ptr<c10d::Work> CpuBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                           const c10d::AllgatherOptions& opts) {
  constexpr const char* kOp = "all_gather_into_tensor";
  guardCall(kOp, [&] { checkAllgatherBase(output, input, size_); });
  at::Tensor out = output;
  at::Tensor in = input;
  const int rank = rank_;
  const int size = size_;
  return launch(c10d::OpType::_ALLGATHER_BASE, "tuned:all_gather_into_tensor", {out}, {in}, opts.asyncOp, opts.timeout,
                cpu::tensorBytes(out),
                [out, in, rank, size](engine::HostCollectives& engine, const core::OpContext& ctx) {
                  allgatherBase(engine, ctx, out, in, rank, size);
                });
}

c10::intrusive_ptr<c10d::Work> CpuBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                           std::vector<at::Tensor>& inputs,
                                                                           const c10d::AllgatherOptions& opts) {
  constexpr const char* kOp = "all_gather_into_tensor_coalesced";
  size_t bytes = 0;
  guardCall(kOp, [&] {
    TORCH_CHECK(outputs.size() == inputs.size(), outputs.size(), " outputs for ", inputs.size(), " inputs");
    for (size_t i = 0; i < inputs.size(); ++i) {
      checkAllgatherBase(outputs[i], inputs[i], size_);
      bytes += cpu::tensorBytes(outputs[i]);
    }
  });
  std::vector<at::Tensor> outs = outputs;
  std::vector<at::Tensor> ins = inputs;
  const int rank = rank_;
  const int size = size_;
  return launch(c10d::OpType::COALESCED, "tuned:all_gather_into_tensor_coalesced", outs, ins, opts.asyncOp,
                opts.timeout, bytes,
                [outs, ins, rank, size](engine::HostCollectives& engine, const core::OpContext& ctx) {
                  for (size_t i = 0; i < ins.size(); ++i) {
                    allgatherBase(engine, ctx, outs[i], ins[i], rank, size);
                  }
                });
}

c10::intrusive_ptr<c10d::Work> CpuBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                               std::vector<at::Tensor>& inputs,
                                                               const c10d::AllgatherOptions& opts) {
  constexpr const char* kOp = "all_gather_coalesced";
  size_t bytes = 0;
  guardCall(kOp, [&] {
    TORCH_CHECK(outputLists.size() == size_t(size_), "expects one output list per rank (", size_, "), got ",
                outputLists.size());
    for (const auto& list : outputLists) {
      TORCH_CHECK(list.size() == inputs.size(), "each output list needs ", inputs.size(), " tensors");
      for (size_t i = 0; i < inputs.size(); ++i) {
        cpu::checkCpuDense(inputs[i], "an input");
        cpu::checkCpuDense(list[i], "an output");
        cpu::checkLike(list[i], inputs[i], "an output");
        bytes += cpu::tensorBytes(list[i]);
      }
    }
  });
  std::vector<std::vector<at::Tensor>> lists = outputLists;
  std::vector<at::Tensor> ins = inputs;
  std::vector<at::Tensor> flatOuts;
  for (const auto& l : lists) {
    flatOuts.insert(flatOuts.end(), l.begin(), l.end());
  }
  const int rank = rank_;
  return launch(c10d::OpType::ALLGATHER_COALESCED, "tuned:all_gather_coalesced", flatOuts, ins, opts.asyncOp,
                opts.timeout, bytes, [lists, ins, rank](engine::HostCollectives& engine, const core::OpContext& ctx) {
                  for (size_t i = 0; i < ins.size(); ++i) {
                    std::vector<at::Tensor> outs;
                    outs.reserve(lists.size());
                    for (const auto& l : lists) {
                      outs.push_back(l[i]);
                    }
                    allgatherInto(engine, ctx, ins[i], outs, rank);
                  }
                });
}

}  // namespace tunedist::cpu
