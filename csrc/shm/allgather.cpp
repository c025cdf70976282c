// all_gather: every rank writes its chunk into its slot, then every rank copies the peers' chunks out.
#include <algorithm>

#include "core/error.h"
#include "shm/comm.h"

namespace tunedist::shm {

// all_gather / gather (gatherTo, gather.cpp), per chunk of one slot:
//   1. copy our chunk into our slot;
//   2. publish; wait for all;
//   3. copy each peer's chunk into its output block (gather: on the root only).
// Our own block is copied last, straight from the input, so an input that is a view into its own block of the
// output (FSDP2's in-place all-gather) is never overwritten before it is read.
void ShmComm::allgather(const OpContext& ctx, const void* in, size_t bytes, void* const* outs) {
  gatherTo(ctx, in, bytes, outs, -1);
}

}  // namespace tunedist::shm
