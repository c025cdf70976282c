// Cross-host barrier: the agreement of every rank is the barrier.
#include "backend/engine/hier/algorithms.h"

#include <c10/util/Exception.h>

namespace tunedist::engine::hier {

void barrier(Ctx c) { agreeEverywhere(c, describe(shm::OpCode::kBarrier, c.op.seq, 0, 0)); }

}  // namespace tunedist::engine::hier
