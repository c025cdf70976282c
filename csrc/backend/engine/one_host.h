// OneHost: the HostCollectives of a group whose ranks all share this host: every collective is one call into the
// shared-memory communicator (shm::ShmComm), on the staged tensors' memory.
#pragma once

#include <memory>

#include "backend/engine/host_collectives.h"

namespace tunedist::engine {

class OneHost final : public HostCollectives {
 public:
  explicit OneHost(std::unique_ptr<shm::ShmComm> comm) : comm_(std::move(comm)) {}

  void allreduce(const core::OpContext& ctx, const at::Tensor& t, const kernels::ReduceArgs& args) override;
  void broadcast(const core::OpContext& ctx, const at::Tensor& t, int root) override;
  void reduce(const core::OpContext& ctx, const at::Tensor& t, const kernels::ReduceArgs& args, int root) override;
  void allgather(const core::OpContext& ctx, const at::Tensor& in, const std::vector<at::Tensor>& blocks) override;
  void gather(const core::OpContext& ctx, const at::Tensor& in, const std::vector<at::Tensor>& blocks,
              int root) override;
  void scatter(const core::OpContext& ctx, const std::vector<at::Tensor>& blocks, const at::Tensor& out,
               int root) override;
  void reduceScatter(const core::OpContext& ctx, const std::vector<at::Tensor>& blocks, const at::Tensor& out,
                     const kernels::ReduceArgs& args) override;
  void alltoallv(const core::OpContext& ctx, const std::vector<const void*>& sends,
                 const std::vector<size_t>& sendBytes, const std::vector<void*>& recvs,
                 const std::vector<size_t>& recvBytes) override;
  void barrier(const core::OpContext& ctx) override;

  void abort(const std::string& reason) override { comm_->abort(reason); }
  size_t reservedShmBytes() const override { return comm_->reservedBytes(); }
  const shm::ShmComm& hostComm() const override { return *comm_; }

 private:
  std::unique_ptr<shm::ShmComm> comm_;
};

}  // namespace tunedist::engine
