#include "backend/engine/one_host.h"

#include "backend/engine/tensors.h"

namespace tunedist::engine {
namespace {

// One pointer per rank into `blocks`; null where a rank has no block (a gather's or scatter's non-root).
template <typename Ptr>
std::vector<Ptr> pointers(const std::vector<at::Tensor>& blocks, int size) {
  std::vector<Ptr> ptrs(size_t(size), nullptr);
  for (size_t p = 0; p < blocks.size(); ++p) {
    ptrs[p] = blocks[p].data_ptr();
  }
  return ptrs;
}

}  // namespace

void OneHost::allreduce(const core::OpContext& ctx, const at::Tensor& t, const kernels::ReduceArgs& args) {
  comm_->allreduce(ctx, t.data_ptr(), t.data_ptr(), size_t(t.numel()), args);
}

void OneHost::broadcast(const core::OpContext& ctx, const at::Tensor& t, int root) {
  comm_->broadcast(ctx, t.data_ptr(), tensorBytes(t), root);
}

void OneHost::reduce(const core::OpContext& ctx, const at::Tensor& t, const kernels::ReduceArgs& args, int root) {
  comm_->reduce(ctx, t.data_ptr(), t.data_ptr(), size_t(t.numel()), args, root);
}

void OneHost::allgather(const core::OpContext& ctx, const at::Tensor& in, const std::vector<at::Tensor>& blocks) {
  comm_->allgather(ctx, in.data_ptr(), tensorBytes(in), pointers<void*>(blocks, comm_->size()).data());
}

void OneHost::gather(const core::OpContext& ctx, const at::Tensor& in, const std::vector<at::Tensor>& blocks,
                     int root) {
  comm_->gather(ctx, in.data_ptr(), tensorBytes(in), pointers<void*>(blocks, comm_->size()).data(), root);
}

void OneHost::scatter(const core::OpContext& ctx, const std::vector<at::Tensor>& blocks, const at::Tensor& out,
                      int root) {
  comm_->scatter(ctx, pointers<const void*>(blocks, comm_->size()).data(), out.data_ptr(), tensorBytes(out), root);
}

// The engine reads every block while it writes `out`: a block that overlaps `out` is read from a copy, except our
// own block when it is exactly `out` (the engine's element-wise reduce allows that, checked by pointer equality).
void OneHost::reduceScatter(const core::OpContext& ctx, const std::vector<at::Tensor>& blocks, const at::Tensor& out,
                            const kernels::ReduceArgs& args) {
  std::vector<at::Tensor> staged;
  std::vector<const void*> ptrs;
  staged.reserve(blocks.size());
  for (size_t p = 0; p < blocks.size(); ++p) {
    const bool exactOwn = int(p) == comm_->rank() && blocks[p].data_ptr() == out.data_ptr() &&
                          blocks[p].is_contiguous();
    const bool clash = !exactOwn && overlaps(blocks[p], out);
    staged.push_back(clash ? blocks[p].contiguous().clone() : tunedist::engine::staged(blocks[p]));
    ptrs.push_back(staged.back().data_ptr());
  }
  comm_->reduceScatter(ctx, ptrs.data(), out.data_ptr(), size_t(out.numel()), args);
}

void OneHost::alltoallv(const core::OpContext& ctx, const std::vector<const void*>& sends,
                        const std::vector<size_t>& sendBytes, const std::vector<void*>& recvs,
                        const std::vector<size_t>& recvBytes) {
  comm_->alltoallv(ctx, sends.data(), sendBytes.data(), recvs.data(), recvBytes.data());
}

void OneHost::barrier(const core::OpContext& ctx) { comm_->barrier(ctx); }

}  // namespace tunedist::engine
