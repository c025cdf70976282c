// SymmetricHost: the HostCollectives of a one-host group whose ranks may allocate from a symmetric heap
// (shm/heap.h; Backend::allocateTensor, tunedist.symmetric_empty): zero-copy where this host measured it faster, else
// copying. A collective whose buffer lies in this rank's heap and reaches ShmOptions::zeroCopyMinBytes goes to the
// communicator's zero-copy collectives (shm/zero_copy/), which pick its path per size class from the group's
// measurements (path_chooser.h) and read and write peers' buffers directly; every other call is the copying engine's
// (OneHost). Ranks need not decide alike: the group votes at the operation's first round, and when some buffers are
// symmetric and some not, every rank runs the copying algorithm (ZeroCopyCollectives::runVoted).
#pragma once

#include <memory>

#include "backend/engine/one_host.h"
#include "shm/heap.h"
#include "shm/zero_copy/zero_copy.h"

namespace tunedist::engine {

class SymmetricHost final : public HostCollectives {
 public:
  explicit SymmetricHost(std::unique_ptr<shm::ShmComm> comm);

  void allreduce(const core::OpContext& ctx, const at::Tensor& t, const kernels::ReduceArgs& args) override;
  void broadcast(const core::OpContext& ctx, const at::Tensor& t, int root) override;
  void reduce(const core::OpContext& ctx, const at::Tensor& t, const kernels::ReduceArgs& args, int root) override {
    copying_.reduce(ctx, t, args, root);
  }
  void allgather(const core::OpContext& ctx, const at::Tensor& in, const std::vector<at::Tensor>& blocks) override;
  void gather(const core::OpContext& ctx, const at::Tensor& in, const std::vector<at::Tensor>& blocks,
              int root) override {
    copying_.gather(ctx, in, blocks, root);
  }
  void scatter(const core::OpContext& ctx, const std::vector<at::Tensor>& blocks, const at::Tensor& out,
               int root) override {
    copying_.scatter(ctx, blocks, out, root);
  }
  void reduceScatter(const core::OpContext& ctx, const std::vector<at::Tensor>& blocks, const at::Tensor& out,
                     const kernels::ReduceArgs& args) override;
  void alltoallv(const core::OpContext& ctx, const std::vector<const void*>& sends,
                 const std::vector<size_t>& sendBytes, const std::vector<void*>& recvs,
                 const std::vector<size_t>& recvBytes) override {
    copying_.alltoallv(ctx, sends, sendBytes, recvs, recvBytes);
  }
  void barrier(const core::OpContext& ctx) override { copying_.barrier(ctx); }

  void abort(const std::string& reason) override { copying_.abort(reason); }
  size_t reservedShmBytes() const override { return copying_.reservedShmBytes(); }
  const shm::ShmComm& hostComm() const override { return copying_.hostComm(); }

  // Collective: every rank's `bytes` at `ptr` (in its symmetric heap at `ref`), mapped here: the rendezvous of
  // torch's symmetric memory and of c10d windows (backend/cpu/symm_mem/). Only this engine offers it: the ranks of
  // a group that spans hosts cannot map each other's memory.
  shm::zero_copy::SymmetricPeers exchangeSymmetric(const core::OpContext& ctx, void* ptr, shm::HeapRef ref,
                                                   size_t bytes);

 private:
  // Where [ptr, ptr + bytes) sits in our heap, when it does and the operation reaches `minBytes`
  // (ZeroCopyCollectives::accepts).
  bool zeroCopy(const void* ptr, size_t bytes, shm::HeapRef* ref, size_t minBytes) const {
    return zeroCopy_ != nullptr && zeroCopy_->accepts(ptr, bytes, minBytes, ref);
  }
  // A call that copies because our buffer does not qualify: counted by the collective's path chooser all the same
  // (ZeroCopyCollectives::pass), so every rank's probe schedule stays the same.
  void passed(shm::zero_copy::ZeroCopyCollectives::Op op, size_t bytes) {
    if (zeroCopy_ != nullptr) {
      zeroCopy_->pass(op, bytes);
    }
  }
  // Whether blocks[p] are consecutive contiguous pieces of one buffer that starts at blocks[0], each `bytes` long.
  static bool consecutive(const std::vector<at::Tensor>& blocks, size_t bytes);

  // The copying engine's communicator's zero-copy collectives (null without a heap).
  shm::zero_copy::ZeroCopyCollectives* zeroCopy_;
  int rank_;
  size_t minBytes_;  // ShmOptions::zeroCopyMinBytes()
  OneHost copying_;
};

}  // namespace tunedist::engine
