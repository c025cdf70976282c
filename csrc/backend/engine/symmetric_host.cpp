#include "backend/engine/symmetric_host.h"

#include "backend/cpu/checks.h"

namespace tunedist {

SymmetricHost::SymmetricHost(std::unique_ptr<shm::ShmComm> comm)
    : comm_(comm.get()),
      minBytes_(comm->options().symmetricMinBytesFor(comm->size())),
      broadcastMinBytes_(comm->options().symmetricBroadcastMinBytesFor(comm->size())),
      copying_(std::move(comm)) {}

bool SymmetricHost::symmetric(const void* ptr, size_t bytes, shm::HeapRef* ref, size_t minBytes) const {
  const auto& heap = comm_->heap();
  return heap != nullptr && comm_->size() > 1 && bytes >= minBytes && heap->locate(ptr, bytes, ref);
}

bool SymmetricHost::consecutive(const std::vector<at::Tensor>& blocks, size_t bytes) {
  const char* base = static_cast<const char*>(blocks.empty() ? nullptr : blocks[0].data_ptr());
  for (size_t p = 0; p < blocks.size(); ++p) {
    if (!blocks[p].is_contiguous() || blocks[p].data_ptr() != base + p * bytes ||
        ops::tensorBytes(blocks[p]) != bytes) {
      return false;
    }
  }
  return base != nullptr;
}

void SymmetricHost::allreduce(const shm::OpContext& ctx, const at::Tensor& t, const shm::ReduceArgs& args) {
  shm::HeapRef ref;
  if (symmetric(t.data_ptr(), ops::tensorBytes(t), &ref)) {
    comm_->allreduceSymmetric(ctx, t.data_ptr(), ref, size_t(t.numel()), args);
  } else {
    copying_.allreduce(ctx, t, args);
  }
}

void SymmetricHost::broadcast(const shm::OpContext& ctx, const at::Tensor& t, int root) {
  shm::HeapRef ref;
  if (symmetric(t.data_ptr(), ops::tensorBytes(t), &ref, broadcastMinBytes_)) {
    comm_->broadcastSymmetric(ctx, t.data_ptr(), ref, ops::tensorBytes(t), root);
  } else {
    copying_.broadcast(ctx, t, root);
  }
}

void SymmetricHost::allgather(const shm::OpContext& ctx, const at::Tensor& in, const std::vector<at::Tensor>& blocks) {
  const size_t bytes = ops::tensorBytes(in);
  shm::HeapRef ref;
  if (consecutive(blocks, bytes) && symmetric(blocks[0].data_ptr(), bytes * blocks.size(), &ref)) {
    comm_->allgatherSymmetric(ctx, in.data_ptr(), bytes, blocks[0].data_ptr(), ref);
  } else {
    copying_.allgather(ctx, in, blocks);
  }
}

void SymmetricHost::reduceScatter(const shm::OpContext& ctx, const std::vector<at::Tensor>& blocks,
                                  const at::Tensor& out, const shm::ReduceArgs& args) {
  const size_t bytes = ops::tensorBytes(out);
  const int rank = comm_->rank();
  shm::HeapRef ref;
  // The output may be our own block of the input (no peer reads it), but no other part of the input.
  bool outOk = true;
  for (size_t p = 0; p < blocks.size() && outOk; ++p) {
    outOk = int(p) == rank ? (blocks[p].data_ptr() == out.data_ptr() || !ops::overlaps(blocks[p], out))
                           : !ops::overlaps(blocks[p], out);
  }
  if (outOk && consecutive(blocks, bytes) && symmetric(blocks[0].data_ptr(), bytes * blocks.size(), &ref)) {
    comm_->reduceScatterSymmetric(ctx, blocks[0].data_ptr(), ref, out.data_ptr(), size_t(out.numel()), args);
  } else {
    copying_.reduceScatter(ctx, blocks, out, args);
  }
}

}  // namespace tunedist
