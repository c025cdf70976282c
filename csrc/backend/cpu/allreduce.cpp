// all_reduce and all_reduce_coalesced.
#include "backend/cpu/checks.h"
#include "backend/cpu/cpu_backend.h"

namespace tunedist {

namespace {
constexpr const char* kAllreduce = "all_reduce";

// The body of one dense all_reduce, queued or inline.
auto allreduceBody(const at::Tensor& t, const shm::ReduceArgs& args) {
  return [t, args](HostCollectives& engine, const shm::OpContext& ctx) {
    at::Tensor s = ops::staged(t);
    engine.allreduce(ctx, s, args);
    ops::copyBack(t, s);
  };
}
}  // namespace

shm::ReduceArgs CpuBackend::allreduceArgs(size_t count, const at::Tensor& tensor, const c10d::AllreduceOptions& opts) {
  shm::ReduceArgs args;
  guardCall(kAllreduce, [&] {
    TORCH_CHECK(count == 1, kAllreduce, ": expects exactly one tensor, got ", count);
    ops::checkCpuDense(tensor, kAllreduce, "the tensor");
    args = ops::reduceArgs(opts.reduceOp, tensor.scalar_type(), size_, kAllreduce);
  });
  return args;
}

c10::intrusive_ptr<c10d::Work> CpuBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].layout() == c10::kSparse) {
    return allreduceSparse(tensors, opts);
  }
  const shm::ReduceArgs args = allreduceArgs(tensors.size(), tensors.empty() ? at::Tensor() : tensors[0], opts);
  const at::Tensor& t = tensors[0];
  return launch(c10d::OpType::ALLREDUCE, "tuned:all_reduce", tensors, tensors, opts.asyncOp, opts.timeout,
                ops::tensorBytes(t), allreduceBody(t, args));
}

// torch.ops.tunedist.all_reduce_ (csrc/ops/all_reduce.cpp) returns no Work, so where the call would run inline it
// makes none: the Work's allocation, settling and wait() were ~0.2 us of a ~5 us call at 4 KiB.
void CpuBackend::allreduceNow(const at::Tensor& tensor, const c10d::AllreduceOptions& opts) {
  if (tensor.layout() != c10::kSparse) {
    const shm::ReduceArgs args = allreduceArgs(1, tensor, opts);
    auto body = allreduceBody(tensor, args);
    if (executor_->runNow("tuned:all_reduce", effectiveTimeout(opts.timeout), ops::tensorBytes(tensor),
                          [this, &body](const shm::OpContext& ctx) { body(*engine_, ctx); })) {
      return;
    }
  }
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions sync = opts;
  sync.asyncOp = false;
  if (auto work = allreduce(tensors, sync)) {  // none where it ran inline after all (Executor::Options)
    work->wait();
  }
}

// The tensors travel as one flat buffer per call: one synchronisation for all of them instead of one each.
c10::intrusive_ptr<c10d::Work> CpuBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceCoalescedOptions& opts) {
  constexpr const char* kOp = "all_reduce_coalesced";
  shm::ReduceArgs args;
  size_t bytes = 0;
  guardCall(kOp, [&] {
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
                opts.timeout, bytes, [ts, args](HostCollectives& engine, const shm::OpContext& ctx) {
                  std::vector<at::Tensor> flat;
                  flat.reserve(ts.size());
                  for (const auto& t : ts) {
                    flat.push_back(t.reshape({-1}));
                  }
                  at::Tensor buf = at::cat(flat);
                  engine.allreduce(ctx, buf, args);
                  int64_t off = 0;
                  for (const auto& t : ts) {
                    t.copy_(buf.narrow(0, off, t.numel()).view(t.sizes()));
                    off += t.numel();
                  }
                });
}

}  // namespace tunedist
