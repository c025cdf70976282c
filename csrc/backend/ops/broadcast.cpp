// broadcast and reduce.
#include "backend/ops/common.h"

namespace tunedist {

c10::intrusive_ptr<c10d::Work> TunedBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  constexpr const char* kOp = "broadcast";
  if (auto* nccl = cudaSide(kOp, tensors)) {
    return nccl->broadcast(tensors, opts);
  }
  ops::guardCall(*this, kOp, [&] {
    TORCH_CHECK(tensors.size() == 1, kOp, ": expects exactly one tensor, got ", tensors.size());
    ops::checkCpuDense(tensors[0], kOp, "the tensor");
    TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, kOp, ": root ", opts.rootRank,
                " is outside the group of ", size_);
    TORCH_CHECK(opts.rootTensor == 0, kOp, ": rootTensor must be 0, got ", opts.rootTensor);
  });
  at::Tensor t = tensors[0];
  const int root = int(opts.rootRank);
  return launch(c10d::OpType::BROADCAST, "tuned:broadcast", tensors, tensors, opts.asyncOp, opts.timeout,
                ops::tensorBytes(t), [this, t, root](const shm::OpContext& ctx) {
                  at::Tensor s = ops::staged(t);
                  if (cross_) {
                    runHier(ctx, [&] { hier::broadcast(hierCtx(ctx), s, root); });
                  } else {
                    comm_->broadcast(ctx, s.data_ptr(), ops::tensorBytes(s), root);
                  }
                  if (rank_ != root) {
                    ops::copyBack(t, s);
                  }
                });
}

c10::intrusive_ptr<c10d::Work> TunedBackend::reduce(std::vector<at::Tensor>& tensors,
                                                    const c10d::ReduceOptions& opts) {
  constexpr const char* kOp = "reduce";
  if (auto* nccl = cudaSide(kOp, tensors)) {
    return nccl->reduce(tensors, opts);
  }
  shm::ReduceArgs args;
  ops::guardCall(*this, kOp, [&] {
    TORCH_CHECK(tensors.size() == 1, kOp, ": expects exactly one tensor, got ", tensors.size());
    ops::checkCpuDense(tensors[0], kOp, "the tensor");
    TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, kOp, ": root ", opts.rootRank,
                " is outside the group of ", size_);
    TORCH_CHECK(opts.rootTensor == 0, kOp, ": rootTensor must be 0, got ", opts.rootTensor);
    args = ops::reduceArgs(opts.reduceOp, tensors[0].scalar_type(), size_, kOp);
  });
  at::Tensor t = tensors[0];
  const int root = int(opts.rootRank);
  return launch(c10d::OpType::REDUCE, "tuned:reduce", tensors, tensors, opts.asyncOp, opts.timeout,
                ops::tensorBytes(t), [this, t, args, root](const shm::OpContext& ctx) {
                  // Across hosts: an all-reduce into a copy on the ranks other than the root.
                  at::Tensor s = cross_ && rank_ != root ? t.contiguous().clone() : ops::staged(t);
                  if (cross_) {
                    runHier(ctx, [&] { hier::allreduce(hierCtx(ctx), s, args); });
                  } else {
                    comm_->reduce(ctx, s.data_ptr(), s.data_ptr(), size_t(s.numel()), args, root);
                  }
                  if (rank_ == root) {
                    ops::copyBack(t, s);
                  }
                });
}

}  // namespace tunedist
