// all_gather (list), all_gather_into_tensor (_allgather_base) and their coalesced forms.
#include "backend/ops/common.h"

namespace tunedist {
namespace {

// Gathers `in` from every rank into blocks[p] (each tensorBytes(in) bytes of contiguous memory); see
// ops::unaliasedSource for an input that is a view into the output.
void gatherInto(TunedBackend& backend, const shm::OpContext& ctx, const at::Tensor& in, std::vector<void*>& blocks,
                const std::vector<at::Tensor>& outs) {
  shm::ShmComm& comm = backend.comm();
  at::Tensor src = ops::unaliasedSource(ops::staged(in), outs, backend.rank());
  if (backend.crossHost() != nullptr) {
    backend.runHier(ctx, [&] { hier::allgather(backend.hierCtx(ctx), src, outs); });
    return;
  }
  comm.allgather(ctx, src.data_ptr(), ops::tensorBytes(src), blocks.data());
}

}  // namespace

c10::intrusive_ptr<c10d::Work> TunedBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllgatherOptions& opts) {
  constexpr const char* kOp = "all_gather";
  if (auto* nccl = cudaSide(kOp, outputs, inputs)) {
    return nccl->allgather(outputs, inputs, opts);
  }
  ops::guardCall(*this, kOp, [&] {
    TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1, kOp, ": expects one input and one output list");
    TORCH_CHECK(outputs[0].size() == size_t(size_), kOp, ": the output list has ", outputs[0].size(),
                " tensors for a group of ", size_);
    ops::checkCpuDense(inputs[0], kOp, "the input");
    for (const auto& o : outputs[0]) {
      ops::checkCpuDense(o, kOp, "an output");
      ops::checkLike(o, inputs[0], kOp, "an output");
    }
  });
  at::Tensor in = inputs[0];
  std::vector<at::Tensor> outs = outputs[0];
  return launch(c10d::OpType::ALLGATHER, "tuned:all_gather", outs, inputs, opts.asyncOp, opts.timeout,
                ops::tensorBytes(in) * size_t(size_), [this, in, outs](const shm::OpContext& ctx) {
                  std::vector<at::Tensor> staged;
                  std::vector<void*> blocks;
                  for (const auto& o : outs) {
                    staged.push_back(ops::staged(o));
                    blocks.push_back(staged.back().data_ptr());
                  }
                  gatherInto(*this, ctx, in, blocks, staged);
                  for (size_t p = 0; p < outs.size(); ++p) {
                    ops::copyBack(outs[p], staged[p]);
                  }
                });
}

namespace {

void allgatherBase(TunedBackend& backend, const shm::OpContext& ctx, const at::Tensor& out, const at::Tensor& in) {
  at::Tensor s = ops::staged(out);
  const int size = backend.size();
  const size_t bytes = ops::tensorBytes(in);
  std::vector<void*> blocks;
  std::vector<at::Tensor> views;
  at::Tensor flat = s.view({-1});
  for (int p = 0; p < size; ++p) {
    views.push_back(flat.narrow(0, int64_t(p) * in.numel(), in.numel()));
    blocks.push_back(static_cast<char*>(s.data_ptr()) + size_t(p) * bytes);
  }
  gatherInto(backend, ctx, in, blocks, views);
  ops::copyBack(out, s);
}

void checkAllgatherBase(const at::Tensor& out, const at::Tensor& in, int size, const char* op) {
  ops::checkCpuDense(in, op, "the input");
  ops::checkCpuDense(out, op, "the output");
  TORCH_CHECK(out.scalar_type() == in.scalar_type(), op, ": output dtype ", out.scalar_type(),
              " differs from input dtype ", in.scalar_type());
  TORCH_CHECK(out.numel() == in.numel() * size, op, ": the output has ", out.numel(),
              " elements; expected input size ", in.numel(), " x group size ", size);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> TunedBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions& opts) {
  constexpr const char* kOp = "all_gather_into_tensor";
  if (auto* nccl = cudaSide(kOp, output, input)) {
    return nccl->_allgather_base(output, input, opts);
  }
  ops::guardCall(*this, kOp, [&] { checkAllgatherBase(output, input, size_, kOp); });
  at::Tensor out = output;
  at::Tensor in = input;
  return launch(c10d::OpType::_ALLGATHER_BASE, "tuned:all_gather_into_tensor", {out}, {in}, opts.asyncOp,
                opts.timeout, ops::tensorBytes(out),
                [this, out, in](const shm::OpContext& ctx) { allgatherBase(*this, ctx, out, in); });
}

c10::intrusive_ptr<c10d::Work> TunedBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const c10d::AllgatherOptions& opts) {
  constexpr const char* kOp = "all_gather_into_tensor_coalesced";
  if (auto* nccl = cudaSide(kOp, outputs, inputs)) {
    return nccl->allgather_into_tensor_coalesced(outputs, inputs, opts);
  }
  size_t bytes = 0;
  ops::guardCall(*this, kOp, [&] {
    TORCH_CHECK(outputs.size() == inputs.size(), kOp, ": ", outputs.size(), " outputs for ", inputs.size(),
                " inputs");
    for (size_t i = 0; i < inputs.size(); ++i) {
      checkAllgatherBase(outputs[i], inputs[i], size_, kOp);
      bytes += ops::tensorBytes(outputs[i]);
    }
  });
  std::vector<at::Tensor> outs = outputs;
  std::vector<at::Tensor> ins = inputs;
  return launch(c10d::OpType::COALESCED, "tuned:all_gather_into_tensor_coalesced", outs, ins,
                opts.asyncOp, opts.timeout, bytes, [this, outs, ins](const shm::OpContext& ctx) {
                  for (size_t i = 0; i < ins.size(); ++i) {
                    allgatherBase(*this, ctx, outs[i], ins[i]);
                  }
                });
}

c10::intrusive_ptr<c10d::Work> TunedBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) {
  constexpr const char* kOp = "all_gather_coalesced";
  if (auto* nccl = cudaSide(kOp, outputLists, inputs)) {
    return nccl->allgather_coalesced(outputLists, inputs, opts);
  }
  size_t bytes = 0;
  ops::guardCall(*this, kOp, [&] {
    TORCH_CHECK(outputLists.size() == size_t(size_), kOp, ": expects one output list per rank (", size_,
                "), got ", outputLists.size());
    for (const auto& list : outputLists) {
      TORCH_CHECK(list.size() == inputs.size(), kOp, ": each output list needs ", inputs.size(), " tensors");
      for (size_t i = 0; i < inputs.size(); ++i) {
        ops::checkCpuDense(inputs[i], kOp, "an input");
        ops::checkCpuDense(list[i], kOp, "an output");
        ops::checkLike(list[i], inputs[i], kOp, "an output");
        bytes += ops::tensorBytes(list[i]);
      }
    }
  });
  std::vector<std::vector<at::Tensor>> lists = outputLists;
  std::vector<at::Tensor> ins = inputs;
  std::vector<at::Tensor> flatOuts;
  for (const auto& l : lists) {
    flatOuts.insert(flatOuts.end(), l.begin(), l.end());
  }
  return launch(c10d::OpType::ALLGATHER_COALESCED, "tuned:all_gather_coalesced", flatOuts, ins, opts.asyncOp,
                opts.timeout, bytes, [this, lists, ins](const shm::OpContext& ctx) {
                  for (size_t i = 0; i < ins.size(); ++i) {
                    std::vector<at::Tensor> staged;
                    std::vector<void*> blocks;
                    for (const auto& l : lists) {
                      staged.push_back(ops::staged(l[i]));
                      blocks.push_back(staged.back().data_ptr());
                    }
                    gatherInto(*this, ctx, ins[i], blocks, staged);
                    for (size_t p = 0; p < lists.size(); ++p) {
                      ops::copyBack(lists[p][i], staged[p]);
                    }
                  }
                });
}

}  // namespace tunedist
