// all_reduce and all_reduce_coalesced.
#include "backend/ops/common.h"

namespace tunedist {

c10::intrusive_ptr<c10d::Work> TunedBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  constexpr const char* kOp = "all_reduce";
  if (auto* nccl = cudaSide(kOp, tensors)) {
    return nccl->allreduce(tensors, opts);
  }
  shm::ReduceArgs args;
  ops::guardCall(*this, kOp, [&] {
    TORCH_CHECK(tensors.size() == 1, kOp, ": expects exactly one tensor, got ", tensors.size());
    ops::checkCpuDense(tensors[0], kOp, "the tensor");
    args = ops::reduceArgs(opts.reduceOp, tensors[0].scalar_type(), size_, kOp);
  });
  at::Tensor t = tensors[0];
  return launch(c10d::OpType::ALLREDUCE, "tuned:all_reduce", tensors, tensors, opts.asyncOp, opts.timeout,
                ops::tensorBytes(t), [this, t, args](const shm::OpContext& ctx) {
                  at::Tensor s = ops::staged(t);
                  if (cross_) {
                    runHier(ctx, [&] { hier::allreduce(hierCtx(ctx), s, args); });
                  } else {
                    comm_->allreduce(ctx, s.data_ptr(), s.data_ptr(), size_t(s.numel()), args);
                  }
                  ops::copyBack(t, s);
                });
}

// The tensors travel as one flat buffer per call: one synchronisation for all of them instead of one each.
c10::intrusive_ptr<c10d::Work> TunedBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                 const c10d::AllreduceCoalescedOptions& opts) {
  constexpr const char* kOp = "all_reduce_coalesced";
  if (auto* nccl = cudaSide(kOp, tensors)) {
    return nccl->allreduce_coalesced(tensors, opts);
  }
  shm::ReduceArgs args;
  size_t bytes = 0;
  ops::guardCall(*this, kOp, [&] {
    TORCH_CHECK(!tensors.empty(), kOp, ": expects at least one tensor");
    for (const auto& t : tensors) {
      ops::checkCpuDense(t, kOp, "a tensor");
      TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), kOp, ": all tensors must have one dtype, got ",
                  tensors[0].scalar_type(), " and ", t.scalar_type());
      bytes += ops::tensorBytes(t);
    }
    args = ops::reduceArgs(opts.reduceOp, tensors[0].scalar_type(), size_, kOp);
  });
  std::vector<at::Tensor> ts = tensors;
  return launch(c10d::OpType::ALLREDUCE_COALESCED, "tuned:all_reduce_coalesced", tensors, tensors, opts.asyncOp,
                opts.timeout, bytes, [this, ts, args](const shm::OpContext& ctx) {
                  std::vector<at::Tensor> flat;
                  flat.reserve(ts.size());
                  for (const auto& t : ts) {
                    flat.push_back(t.reshape({-1}));
                  }
                  at::Tensor buf = at::cat(flat);
                  if (cross_) {
                    runHier(ctx, [&] { hier::allreduce(hierCtx(ctx), buf, args); });
                  } else {
                    comm_->allreduce(ctx, buf.data_ptr(), buf.data_ptr(), size_t(buf.numel()), args);
                  }
                  int64_t off = 0;
                  for (const auto& t : ts) {
                    t.copy_(buf.narrow(0, off, t.numel()).view(t.sizes()));
                    off += t.numel();
                  }
                });
}

}  // namespace tunedist
