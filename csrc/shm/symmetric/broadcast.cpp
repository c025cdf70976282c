// broadcast among symmetric buffers: every other rank copies straight out of the root's buffer.
#include "core/error.h"
#include "shm/comm.h"

namespace tunedist::shm {

//   1. publish (the root's buffer holds the data); wait for all; the descriptors agree that every buffer is
//      symmetric;
//   2. every rank but the root copies the root's buffer into its own;
//   3. publish (done reading); wait for all, so the root does not return while a peer still reads its buffer.
void ShmComm::broadcastSymmetric(const OpContext& ctx, void* buf, HeapRef ref, size_t bytes, int root) {
  TD_CHECK(root >= 0 && root < size_, "tunedist: broadcast (seq ", ctx.seq, ") on rank ", rank_, ": root ", root,
           " is outside the group of ", size_);
  const OpDesc desc = makeDesc(OpCode::kBroadcast, ctx.seq, bytes, root);
  runSymmetric(
      ctx, desc, ref,
      [&] {
        // Step 1/2: the root's buffer holds the data.
        syncRound(ctx);
        if (rank_ != root) {
          copyOut(buf, peerBuffer(ctx, root, bytes), bytes, bytes);
        }
        // Step 2/2: we have read the root's buffer; it may return and reuse it.
        syncRound(ctx);
      },
      [&] { broadcastBody(ctx, buf, bytes, root); });
}

}  // namespace tunedist::shm
