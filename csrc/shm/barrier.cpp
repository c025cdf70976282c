// barrier: one round with no data.
#include "shm/algorithms.h"
#include "shm/rounds.h"

namespace tunedist::shm {

// barrier: one round with no data; returns once every rank has entered it.
void barrier(Rounds& r, const core::OpContext& ctx) {
  r.run(ctx, makeDesc(OpCode::kBarrier, ctx.seq, 0, -1), [&] {
    int b = r.beginRound(ctx);
    r.waitAll(ctx, r.publish(ctx));
    r.releaseBuffer(b);
  });
}

}  // namespace tunedist::shm
