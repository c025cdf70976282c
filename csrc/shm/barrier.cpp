// barrier: one round with no data.
#include "shm/comm.h"

namespace tunedist::shm {

// barrier: one round with no data; returns once every rank has entered it.
void ShmComm::barrier(const OpContext& ctx) {
  runOp(ctx, makeDesc(OpCode::kBarrier, ctx.seq, 0, -1), [&] {
    int b = beginRound(ctx);
    waitAll(ctx, publish(ctx));
    releaseBuffer(b);
  });
}

}  // namespace tunedist::shm
