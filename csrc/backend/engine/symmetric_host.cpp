#include "backend/engine/symmetric_host.h"

#include "backend/engine/tensors.h"

namespace tunedist::engine {

SymmetricHost::SymmetricHost(std::unique_ptr<shm::ShmComm> comm)
    : zeroCopy_(comm->zeroCopy()),
      rank_(comm->rank()),
      minBytes_(comm->options().zeroCopyMinBytes()),
      copying_(std::move(comm)) {}

bool SymmetricHost::consecutive(const std::vector<at::Tensor>& blocks, size_t bytes) {
  const char* base = static_cast<const char*>(blocks.empty() ? nullptr : blocks[0].data_ptr());
  for (size_t p = 0; p < blocks.size(); ++p) {
    if (!blocks[p].is_contiguous() || blocks[p].data_ptr() != base + p * bytes || tensorBytes(blocks[p]) != bytes) {
      return false;
    }
  }
  return base != nullptr;
}

void SymmetricHost::allreduce(const core::OpContext& ctx, const at::Tensor& t, const kernels::ReduceArgs& args) {
  shm::HeapRef ref;
  if (zeroCopy(t.data_ptr(), tensorBytes(t), &ref, minBytes_)) {
    zeroCopy_->allreduce(ctx, t.data_ptr(), ref, size_t(t.numel()), args);
  } else {
    passed(shm::zero_copy::ZeroCopyCollectives::kAllreduce, tensorBytes(t));
    copying_.allreduce(ctx, t, args);
  }
}

void SymmetricHost::broadcast(const core::OpContext& ctx, const at::Tensor& t, int root) {
  shm::HeapRef ref;
  if (zeroCopy(t.data_ptr(), tensorBytes(t), &ref, minBytes_)) {
    zeroCopy_->broadcast(ctx, t.data_ptr(), ref, tensorBytes(t), root);
  } else {
    passed(shm::zero_copy::ZeroCopyCollectives::kBroadcast, tensorBytes(t));
    copying_.broadcast(ctx, t, root);
  }
}

void SymmetricHost::allgather(const core::OpContext& ctx, const at::Tensor& in, const std::vector<at::Tensor>& blocks) {
  const size_t bytes = tensorBytes(in);
  shm::HeapRef ref;
  if (consecutive(blocks, bytes) && zeroCopy(blocks[0].data_ptr(), bytes * blocks.size(), &ref, minBytes_)) {
    zeroCopy_->allgather(ctx, in.data_ptr(), bytes, blocks[0].data_ptr(), ref);
  } else {
    passed(shm::zero_copy::ZeroCopyCollectives::kAllgather, bytes * blocks.size());
    copying_.allgather(ctx, in, blocks);
  }
}

void SymmetricHost::reduceScatter(const core::OpContext& ctx, const std::vector<at::Tensor>& blocks,
                                  const at::Tensor& out, const kernels::ReduceArgs& args) {
  const size_t bytes = tensorBytes(out);
  shm::HeapRef ref;
  // The output may be our own block of the input (no peer reads it), but no other part of the input.
  bool outOk = true;
  for (size_t p = 0; p < blocks.size() && outOk; ++p) {
    outOk = int(p) == rank_ ? (blocks[p].data_ptr() == out.data_ptr() || !overlaps(blocks[p], out))
                            : !overlaps(blocks[p], out);
  }
  if (outOk && consecutive(blocks, bytes) && zeroCopy(blocks[0].data_ptr(), bytes * blocks.size(), &ref, minBytes_)) {
    zeroCopy_->reduceScatter(ctx, blocks[0].data_ptr(), ref, out.data_ptr(), size_t(out.numel()), args);
  } else {
    passed(shm::zero_copy::ZeroCopyCollectives::kReduceScatter, bytes * blocks.size());
    copying_.reduceScatter(ctx, blocks, out, args);
  }
}

shm::zero_copy::SymmetricPeers SymmetricHost::exchangeSymmetric(const core::OpContext& ctx, void* ptr, shm::HeapRef ref,
                                                                size_t bytes) {
  TD_ASSERT(zeroCopy_ != nullptr, "a one-host engine without zero-copy collectives");
  return zeroCopy_->exchange(ctx, ptr, ref, bytes);
}

}  // namespace tunedist::engine
