// all_gather: every rank writes its chunk into its slot, then every rank copies the peers' chunks out.
#include <algorithm>

#include "core/error.h"
#include "shm/algorithms.h"
#include "shm/rounds.h"

namespace tunedist::shm {

// all_gather / gather (gatherBody, gather.cpp), per chunk of one slot:
//   1. copy our chunk into our slot (and, from core::ShmOptions::fusedOwnCopyMinBytes, into our own output block in the
//      same pass: the input is read once);
//   2. publish; copy our own chunk straight from the input into our output block unless step 1 did; wait for all;
//   3. copy each peer's chunk into its output block (gather: on the root only).
// Copying our own block in step 2 fills the time a rank would otherwise spin waiting for a slower peer; when ranks
// are in step nobody waits, and the one pass of step 1 costs less than the two copies (kernels/reduce.h,
// copyBytesTwice). An input that partially overlaps its own output block instead has that block copied after the last
// round (the backend clones an input that overlaps a peer's block: cpu::unaliasedSource); one that is exactly its block
// (FSDP2's in-place all-gather) needs no copy.
void allgather(Rounds& r, const core::OpContext& ctx, const void* in, size_t bytes, void* const* outs) {
  r.run(ctx, makeDesc(OpCode::kAllgather, ctx.seq, bytes, -1), [&] { gatherBody(r, ctx, in, bytes, outs, -1); });
}

}  // namespace tunedist::shm
