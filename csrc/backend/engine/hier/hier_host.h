// HierHost: the HostCollectives of a group that spans several hosts. Each collective runs its cross-host algorithm
// (one file each in this folder: shared memory inside each host, gloo between hosts) inside runCrossHost, so a
// failure anywhere reaches every rank of every host.
#pragma once

#include <memory>

#include "backend/engine/hier/algorithms.h"
#include "backend/engine/hier/cross_host.h"
#include "backend/engine/host_collectives.h"

namespace tunedist::engine::hier {

class HierHost final : public HostCollectives {
 public:
  HierHost(std::shared_ptr<CrossHost> cross, std::unique_ptr<shm::ShmComm> comm, core::CrossHostOptions options);

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

  // Fails this host's shared memory and the cross-host state (shared with the other hosts through the store).
  void abort(const std::string& reason) override;
  size_t reservedShmBytes() const override { return comm_->reservedBytes(); }
  const shm::ShmComm& hostComm() const override { return *comm_; }
  CrossHostStats crossHostStats() const override { return cross_->stats(); }

 private:
  // Runs `algorithm` with the context of a cross-host algorithm, as one cross-host phase of ctx (runCrossHost).
  template <typename F>
  void run(const core::OpContext& ctx, F&& algorithm);

  std::shared_ptr<CrossHost> cross_;
  std::unique_ptr<shm::ShmComm> comm_;
  const core::CrossHostOptions options_;
};

}  // namespace tunedist::engine::hier
