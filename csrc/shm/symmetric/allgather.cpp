// all_gather into a symmetric output: every rank copies each peer's block straight out of the peer's output.
#include "core/error.h"
#include "shm/comm.h"

namespace tunedist::shm {

//   1. put our input into block `rank` of our output (nothing to do for FSDP2's in-place all-gather, whose input
//      is that block); publish; wait for all; the descriptors agree that every output is symmetric;
//   2. copy block q of each peer q's output into block q of ours;
//   3. publish (we have read every peer's output); wait for all, so no rank returns while a peer still reads its
//      output.
void ShmComm::allgatherSymmetric(const OpContext& ctx, const void* in, size_t bytes, void* out, HeapRef outRef) {
  const OpDesc desc = makeDesc(OpCode::kAllgather, ctx.seq, bytes, -1);
  char* blocks = static_cast<char*>(out);
  auto copyPath = [&] {
    RankPtrs outs(size_);
    for (int p = 0; p < size_; ++p) {
      outs[p] = blocks + size_t(p) * bytes;
    }
    gatherBody(ctx, in, bytes, const_cast<void* const*>(outs.data()), -1);
  };
  runSymmetric(
      ctx, desc, outRef,
      [&] {
        copyOwn(blocks + size_t(rank_) * bytes, in, bytes);
        // Step 1/2: block `rank` of our output holds our input; every peer may read it.
        syncRound(ctx);
        for (int q = 0; q < size_; ++q) {
          if (q != rank_) {
            copyBytes(blocks + size_t(q) * bytes, peerBuffer(ctx, q, size_t(size_) * bytes) + size_t(q) * bytes, bytes);
          }
        }
        // Step 2/2: we have read every peer's output; each may return and reuse it.
        syncRound(ctx);
      },
      copyPath);
}

}  // namespace tunedist::shm
