// barrier.
#include "backend/cpu/cpu_backend.h"

namespace tunedist::cpu {

c10::intrusive_ptr<c10d::Work> CpuBackend::barrier(const c10d::BarrierOptions& opts) {
  return launch(c10d::OpType::BARRIER, "tuned:barrier", {}, {}, opts.asyncOp, opts.timeout, 0,
                [](engine::HostCollectives& engine, const core::OpContext& ctx) { engine.barrier(ctx); });
}

}  // namespace tunedist::cpu
