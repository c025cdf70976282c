// gather: every rank writes its chunk into its slot, the root copies the peers' chunks out. gatherBody is shared
// with all_gather (root -1).
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "shm/algorithms.h"
#include "shm/rounds.h"

namespace tunedist::shm {

void gather(Rounds& r, const core::OpContext& ctx, const void* in, size_t bytes, void* const* outs, int root) {
  TD_CHECK(root >= 0 && root < r.size(), "tunedist: gather (seq ", ctx.seq, ") on rank ", r.rank(), ": root ", root,
           " is outside the group of ", r.size());
  r.run(ctx, makeDesc(OpCode::kGather, ctx.seq, bytes, root), [&] { gatherBody(r, ctx, in, bytes, outs, root); });
}

void gatherBody(Rounds& r, const core::OpContext& ctx, const void* in, size_t bytes, void* const* outs, int root) {
  const bool all = root < 0;
  const bool receive = all || r.rank() == root;
  const char* src = static_cast<const char*>(in);
  char* own = receive ? static_cast<char*>(outs[r.rank()]) : nullptr;
  // Our own block is copied while the peers catch up (between publishing and waiting), unless the input overlaps
  // it without being it: then a chunk's copy could overwrite input that a later chunk still has to read, so the
  // block goes last, in one memmove.
  const bool ownEarly = receive && (own == src || !kernels::rangesOverlap(own, src, bytes));
  // A rank that writes its slot and copies its own block reads its input once for both
  // (StorePolicy::Scope::copyInAndOwn), before publishing: when ranks are in step, the pass costs less than the two
  // copies it replaces.
  const bool writesSlot = (all || r.rank() != root) && r.size() > 1;
  const bool fused = writesSlot && ownEarly && own != src && bytes >= r.options().fusedOwnCopyMinBytes;
  // What the operation receives decides the stores of its output: the peers' blocks stream above cachedCopyMaxBytes
  // (copyOut), our own block above ownCachedCopyMaxBytes (where the ranges allow: not for the overlapping late copy).
  const size_t received = bytes * size_t(r.size() - 1);
  const bool streamOwn = ownEarly && received > r.options().ownCachedCopyMaxBytes;
  const size_t chunk = r.options().slotBytes;
  // Every round's copies into the slots use the stores the operation's RoundStoreChooser keeps for its size.
  auto stores = r.stores(all ? StorePolicy::kAllgather : StorePolicy::kGather, bytes);
  for (size_t off = 0; off < bytes || off == 0; off += chunk) {
    const size_t n = std::min(chunk, bytes - off);
    int b = r.beginRound(ctx);
    // With no peer (a group of one) nobody reads the slot.
    if (fused) {
      stores.copyInAndOwn(r.slot(r.rank(), b), own + off, src + off, n, streamOwn);
    } else if (writesSlot) {
      stores.copyIn(r.slot(r.rank(), b), src + off, n);
    }
    // Step 1/1: our slot holds bytes [off, off+n) of our input.
    const uint64_t step = r.publish(ctx);
    if (ownEarly && !fused) {
      copyOwn(own + off, src + off, n, streamOwn);
    }
    r.waitAll(ctx, step);
    if (receive) {
      for (int p = 0; p < r.size(); ++p) {
        if (p != r.rank()) {
          copyOut(static_cast<char*>(outs[p]) + off, r.slot(p, b), n, received, r.options().cachedCopyMaxBytes);
        }
      }
    }
    r.releaseBuffer(b);
    if (bytes == 0) {
      break;
    }
  }
  if (receive && !ownEarly) {
    copyOwn(own, src, bytes);
  }
  stores.done();
}

}  // namespace tunedist::shm
