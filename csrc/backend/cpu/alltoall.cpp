// all_to_all_single (even and uneven splits) and all_to_all (lists).
#include "backend/cpu/checks.h"
#include "backend/cpu/cpu_backend.h"

namespace tunedist::cpu {
namespace {

// Row counts per peer: the given splits, or an even split of dim 0.
std::vector<int64_t> rowSplits(const std::vector<int64_t>& splits, const at::Tensor& t, int size, const char* which) {
  if (splits.empty()) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    TORCH_CHECK(rows % size == 0, which, " has ", rows, " rows, not divisible by the group size ", size,
                "; pass split sizes");
    return std::vector<int64_t>(size_t(size), rows / size);
  }
  TORCH_CHECK(splits.size() == size_t(size), which, " split sizes have ", splits.size(), " entries for a group of ",
              size);
  int64_t total = 0;
  for (int64_t s : splits) {
    TORCH_CHECK(s >= 0, "negative split size ", s);
    total += s;
  }
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  TORCH_CHECK(total == rows, which, " split sizes add up to ", total, " but the tensor has ", rows, " rows");
  return splits;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> CpuBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                         std::vector<int64_t>& outputSplitSizes,
                                                         std::vector<int64_t>& inputSplitSizes,
                                                         const c10d::AllToAllOptions& opts) {
  constexpr const char* kOp = "all_to_all_single";
  std::vector<int64_t> outRows;
  std::vector<int64_t> inRows;
  guardCall(kOp, [&] {
    cpu::checkCpuDense(input, "the input");
    cpu::checkCpuDense(output, "the output");
    TORCH_CHECK(input.scalar_type() == output.scalar_type(), "output dtype ", output.scalar_type(),
                " differs from input dtype ", input.scalar_type());
    inRows = rowSplits(inputSplitSizes, input, size_, "the input");
    outRows = rowSplits(outputSplitSizes, output, size_, "the output");
  });
  at::Tensor out = output;
  at::Tensor in = input;
  const int size = size_;
  return launch(c10d::OpType::ALLTOALL_BASE, "tuned:all_to_all_single", {out}, {in}, opts.asyncOp, opts.timeout,
                cpu::tensorBytes(in),
                [out, in, outRows, inRows, size](engine::HostCollectives& engine, const core::OpContext& ctx) {
                  at::Tensor src = cpu::overlaps(in, out) ? in.contiguous().clone() : cpu::staged(in);
                  at::Tensor dst = cpu::staged(out);
                  const size_t inRowBytes = src.dim() == 0 || src.size(0) == 0
                                                ? 0
                                                : cpu::tensorBytes(src) / size_t(src.size(0));
                  const size_t outRowBytes = dst.dim() == 0 || dst.size(0) == 0
                                                 ? 0
                                                 : cpu::tensorBytes(dst) / size_t(dst.size(0));
                  std::vector<const void*> sends;
                  std::vector<void*> recvs;
                  std::vector<size_t> sendBytes;
                  std::vector<size_t> recvBytes;
                  size_t inOff = 0;
                  size_t outOff = 0;
                  for (int p = 0; p < size; ++p) {
                    sends.push_back(static_cast<const char*>(src.data_ptr()) + inOff);
                    recvs.push_back(static_cast<char*>(dst.data_ptr()) + outOff);
                    sendBytes.push_back(size_t(inRows[p]) * inRowBytes);
                    recvBytes.push_back(size_t(outRows[p]) * outRowBytes);
                    inOff += sendBytes.back();
                    outOff += recvBytes.back();
                  }
                  engine.alltoallv(ctx, sends, sendBytes, recvs, recvBytes);
                  cpu::copyBack(out, dst);
                });
}

c10::intrusive_ptr<c10d::Work> CpuBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                    const c10d::AllToAllOptions& opts) {
  constexpr const char* kOp = "all_to_all";
  guardCall(kOp, [&] {
    TORCH_CHECK(outputs.size() == size_t(size_) && inputs.size() == size_t(size_), "expects ", size_,
                " inputs and outputs, got ", inputs.size(), " and ", outputs.size());
    for (int p = 0; p < size_; ++p) {
      cpu::checkCpuDense(inputs[p], "an input");
      cpu::checkCpuDense(outputs[p], "an output");
      TORCH_CHECK(inputs[p].scalar_type() == outputs[p].scalar_type(), "dtypes of input and output ", p, " differ");
    }
  });
  std::vector<at::Tensor> outs = outputs;
  std::vector<at::Tensor> ins = inputs;
  size_t bytes = 0;
  for (const auto& t : ins) {
    bytes += cpu::tensorBytes(t);
  }
  const int size = size_;
  return launch(c10d::OpType::ALLTOALL, "tuned:all_to_all", outs, ins, opts.asyncOp, opts.timeout, bytes,
                [outs, ins, size](engine::HostCollectives& engine, const core::OpContext& ctx) {
                  std::vector<at::Tensor> src;
                  std::vector<at::Tensor> dst;
                  std::vector<const void*> sends;
                  std::vector<void*> recvs;
                  std::vector<size_t> sendBytes;
                  std::vector<size_t> recvBytes;
                  for (int p = 0; p < size; ++p) {
                    bool clash = false;
                    for (const auto& o : outs) {
                      clash = clash || cpu::overlaps(ins[p], o);
                    }
                    src.push_back(clash ? ins[p].contiguous().clone() : cpu::staged(ins[p]));
                    dst.push_back(cpu::staged(outs[p]));
                    sends.push_back(src.back().data_ptr());
                    recvs.push_back(dst.back().data_ptr());
                    sendBytes.push_back(cpu::tensorBytes(src.back()));
                    recvBytes.push_back(cpu::tensorBytes(dst.back()));
                  }
                  engine.alltoallv(ctx, sends, sendBytes, recvs, recvBytes);
                  for (int p = 0; p < size; ++p) {
                    cpu::copyBack(outs[p], dst[p]);
                  }
                });
}

}  // namespace tunedist::cpu
