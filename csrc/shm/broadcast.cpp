// broadcast: the root writes every round, pipelined through the double-buffered slots.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "shm/algorithms.h"
#include "shm/rounds.h"

namespace tunedist::shm {

// broadcast, per chunk of one slot:
//   1. the root copies the chunk into its slot (a broadcast of at least 8 KiB with the stores its RoundStoreChooser
//      keeps, every rank's work counted: the root's copies in and the readers' copies out; a smaller one with
//      streaming stores under core::ShmOptions::broadcastStreamBelowBytes);
//   2. everyone publishes; everyone waits for all (the root's publish is the one that matters);
//   3. the others copy the chunk out of the root's slot (plain stores while all readers together receive at
//      most core::ShmOptions::broadcastCachedCopyMaxBytes).
// Double buffering lets the root fill the next chunk while the others still copy the previous one.
void broadcast(Rounds& r, const core::OpContext& ctx, void* buf, size_t bytes, int root) {
  TD_CHECK(root >= 0 && root < r.size(), "tunedist: broadcast (seq ", ctx.seq, ") on rank ", r.rank(), ": root ", root,
           " is outside the group of ", r.size());
  r.run(ctx, makeDesc(OpCode::kBroadcast, ctx.seq, bytes, root), [&] { broadcastBody(r, ctx, buf, bytes, root); });
}

void broadcastBody(Rounds& r, const core::OpContext& ctx, void* buf, size_t bytes, int root) {
  char* data = static_cast<char*>(buf);
  const size_t chunk = r.options().slotBytes;
  auto stores = r.stores(StorePolicy::kBroadcast, bytes);
  for (size_t off = 0; off < bytes || off == 0; off += chunk) {
    const size_t n = std::min(chunk, bytes - off);
    int b = r.beginRound(ctx);
    // With no peer (a group of one) nobody reads the slot; a small one is read from memory faster than from the
    // root's cache (core::ShmOptions::broadcastStreamBelowBytes).
    if (r.rank() == root && r.size() > 1) {
      if (!stores.active() && bytes < r.options().broadcastStreamBelowBytes) {
        stores.copyInStreaming(r.slot(root, b), data + off, n);
      } else {
        stores.copyIn(r.slot(root, b), data + off, n);
      }
    }
    // Step 1/1: the root's slot holds bytes [off, off+n).
    r.waitAll(ctx, r.publish(ctx));
    if (r.rank() != root) {
      copyOut(data + off, r.slot(root, b), n, bytes * size_t(r.size() - 1), r.options().broadcastCachedCopyMaxBytes);
    }
    r.releaseBuffer(b);
    if (bytes == 0) {
      break;
    }
  }
  stores.done();
}

}  // namespace tunedist::shm
