// broadcast among symmetric buffers: every other rank copies straight out of the root's buffer.
#include "core/error.h"
#include "shm/algorithms.h"
#include "shm/zero_copy/vote.h"

namespace tunedist::shm::zero_copy {

//   1. publish (the root's buffer holds the data); wait for all; the descriptors agree that every buffer is
//      symmetric;
//   2. every rank but the root copies the root's buffer into its own, with the stores the path names;
//   3. publish (done reading); wait for all, so the root does not return while a peer still reads its buffer.
void ZeroCopyCollectives::broadcast(const core::OpContext& ctx, void* buf, HeapRef ref, size_t bytes, int root) {
  TD_CHECK(root >= 0 && root < rounds_.size(), "tunedist: broadcast (seq ", ctx.seq, ") on rank ", rounds_.rank(),
           ": root ", root, " is outside the group of ", rounds_.size());
  const OpDesc desc = makeDesc(OpCode::kBroadcast, ctx.seq, bytes, root);
  runVoted(
      ctx, kBroadcast, bytes, desc, ref,
      [&](bool streaming) {
        // Step 1/2: the root's buffer holds the data.
        rounds_.syncRound(ctx);
        if (rounds_.rank() != root) {
          if (streaming) {
            kernels::copyBytes(buf, peerBuffer(ctx, root, bytes), bytes);
          } else {
            kernels::copyBytesCached(buf, peerBuffer(ctx, root, bytes), bytes);
          }
        }
        // Step 2/2: we have read the root's buffer; it may return and reuse it.
        rounds_.syncRound(ctx);
      },
      [&] { broadcastBody(rounds_, ctx, buf, bytes, root); });
}

}  // namespace tunedist::shm::zero_copy
