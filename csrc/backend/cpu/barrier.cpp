// barrier.
#include "backend/cpu/cpu_backend.h"

namespace tunedist {

c10::intrusive_ptr<c10d::Work> CpuBackend::barrier(const c10d::BarrierOptions& opts) {
  return launch(c10d::OpType::BARRIER, "tuned:barrier", {}, {}, opts.asyncOp, opts.timeout, 0,
                [](HostCollectives& engine, const shm::OpContext& ctx) { engine.barrier(ctx); });
}

}  // namespace tunedist
