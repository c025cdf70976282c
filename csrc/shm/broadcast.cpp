// broadcast: the root writes every round, pipelined through the double-buffered slots.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "shm/comm.h"

namespace tunedist::shm {

// broadcast, per chunk of one slot:
//   1. the root copies the chunk into its slot (a broadcast of at least 8 KiB with the stores its RoundStoreChooser
//      keeps, every rank's work counted: the root's copies in and the readers' copies out; a smaller one with
//      streaming stores under ShmOptions::broadcastStreamBelowBytes);
//   2. everyone publishes; everyone waits for all (the root's publish is the one that matters);
//   3. the others copy the chunk out of the root's slot (plain stores while all readers together receive at
//      most ShmOptions::broadcastCachedCopyMaxBytes).
// Double buffering lets the root fill the next chunk while the others still copy the previous one.
void ShmComm::broadcast(const OpContext& ctx, void* buf, size_t bytes, int root) {
  TD_CHECK(root >= 0 && root < size_, "tunedist: broadcast (seq ", ctx.seq, ") on rank ", rank_, ": root ", root,
           " is outside the group of ", size_);
  runOp(ctx, makeDesc(OpCode::kBroadcast, ctx.seq, bytes, root), [&] { broadcastBody(ctx, buf, bytes, root); });
}

void ShmComm::broadcastBody(const OpContext& ctx, void* buf, size_t bytes, int root) {
  char* data = static_cast<char*>(buf);
  const size_t chunk = options_.slotBytes;
  RoundStores stores(*this, kBroadcast, bytes, size_ > 1);
  for (size_t off = 0; off < bytes || off == 0; off += chunk) {
    const size_t n = std::min(chunk, bytes - off);
    int b = beginRound(ctx);
    // With no peer (a group of one) nobody reads the slot; a small one is read from memory faster than from the
    // root's cache (ShmOptions::broadcastStreamBelowBytes).
    if (rank_ == root && size_ > 1) {
      if (!stores.active() && bytes < options_.broadcastStreamBelowBytes) {
        slotCopy_.copyStreamingUnlessForced(slot(root, b), data + off, n);
      } else {
        copyIntoSlot(slot(root, b), data + off, n);
      }
    }
    // Step 1/1: the root's slot holds bytes [off, off+n).
    waitAll(ctx, publish(ctx));
    if (rank_ != root) {
      copyOut(data + off, slot(root, b), n, bytes * size_t(size_ - 1), options_.broadcastCachedCopyMaxBytes);
    }
    releaseBuffer(b);
    if (bytes == 0) {
      break;
    }
  }
  stores.done();
}

}  // namespace tunedist::shm
