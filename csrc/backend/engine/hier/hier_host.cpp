#include "backend/engine/hier/hier_host.h"

namespace tunedist::engine::hier {

HierHost::HierHost(std::shared_ptr<CrossHost> cross, std::unique_ptr<shm::ShmComm> comm, core::CrossHostOptions options)
    : cross_(std::move(cross)), comm_(std::move(comm)), options_(options) {}

template <typename F>
void HierHost::run(const core::OpContext& ctx, F&& algorithm) {
  runCrossHost(
      *cross_, ctx, [this](const std::string& why) { comm_->abort(why); },
      [&] {
        algorithm(hier::Ctx{*cross_, *comm_, ctx, options_});
      });
}

void HierHost::allreduce(const core::OpContext& ctx, const at::Tensor& t, const kernels::ReduceArgs& args) {
  run(ctx, [&](hier::Ctx c) { hier::allreduce(c, t, args); });
}

void HierHost::broadcast(const core::OpContext& ctx, const at::Tensor& t, int root) {
  run(ctx, [&](hier::Ctx c) { hier::broadcast(c, t, root); });
}

void HierHost::reduce(const core::OpContext& ctx, const at::Tensor& t, const kernels::ReduceArgs& args, int root) {
  run(ctx, [&](hier::Ctx c) { hier::reduce(c, t, args, root); });
}

void HierHost::allgather(const core::OpContext& ctx, const at::Tensor& in, const std::vector<at::Tensor>& blocks) {
  run(ctx, [&](hier::Ctx c) { hier::allgather(c, in, blocks); });
}

void HierHost::gather(const core::OpContext& ctx, const at::Tensor& in, const std::vector<at::Tensor>& blocks,
                      int root) {
  run(ctx, [&](hier::Ctx c) { hier::gather(c, in, blocks, root); });
}

void HierHost::scatter(const core::OpContext& ctx, const std::vector<at::Tensor>& blocks, const at::Tensor& out,
                       int root) {
  run(ctx, [&](hier::Ctx c) { hier::scatter(c, blocks, out, root); });
}

void HierHost::reduceScatter(const core::OpContext& ctx, const std::vector<at::Tensor>& blocks, const at::Tensor& out,
                             const kernels::ReduceArgs& args) {
  run(ctx, [&](hier::Ctx c) { hier::reduceScatter(c, blocks, out, args); });
}

void HierHost::alltoallv(const core::OpContext& ctx, const std::vector<const void*>& sends,
                         const std::vector<size_t>& sendBytes, const std::vector<void*>& recvs,
                         const std::vector<size_t>& recvBytes) {
  run(ctx, [&](hier::Ctx c) { hier::alltoallv(c, sends, sendBytes, recvs, recvBytes); });
}

void HierHost::barrier(const core::OpContext& ctx) {
  run(ctx, [&](hier::Ctx c) { hier::barrier(c); });
}

void HierHost::abort(const std::string& reason) {
  comm_->abort(reason);
  cross_->fail(reason);
}

}  // namespace tunedist::engine::hier
