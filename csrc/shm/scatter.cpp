// scatter: the root writes each peer's part into its slot, every peer copies its part out.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "shm/algorithms.h"
#include "shm/rounds.h"

namespace tunedist::shm {

// scatter, per round of one slot cut into P parts:
//   1. the root copies part q of every peer's block into part q of its slot;
//   2. publish; wait for all;
//   3. rank q copies part q out of the root's slot.
// Every round's copies into the slot use the stores the operation's RoundStoreChooser keeps for its size.
void scatter(Rounds& r, const core::OpContext& ctx, const void* const* ins, void* out, size_t bytes, int root) {
  TD_CHECK(root >= 0 && root < r.size(), "tunedist: scatter (seq ", ctx.seq, ") on rank ", r.rank(), ": root ", root,
           " is outside the group of ", r.size());
  r.run(ctx, makeDesc(OpCode::kScatter, ctx.seq, bytes, root), [&] {
    const size_t part = r.slotPartBytes();
    TD_CHECK(part > 0, "tunedist: scatter: slot too small for ", r.size(), " ranks");
    auto stores = r.stores(StorePolicy::kScatter, bytes * size_t(r.size() - 1));
    for (size_t off = 0; off < bytes || off == 0; off += part) {
      const size_t n = std::min(part, bytes - off);
      int b = r.beginRound(ctx);
      if (r.rank() == root) {
        for (int q = 0; q < r.size(); ++q) {
          if (q != root) {
            stores.copyIn(r.slot(root, b) + size_t(q) * part, static_cast<const char*>(ins[q]) + off, n);
          }
        }
      }
      // Step 1/1: part q of the root's slot holds bytes [off, off+n) of rank q's block.
      r.waitAll(ctx, r.publish(ctx));
      if (r.rank() != root) {
        copyOut(static_cast<char*>(out) + off, r.slot(root, b) + size_t(r.rank()) * part, n, bytes,
                r.options().cachedCopyMaxBytes);
      }
      r.releaseBuffer(b);
      if (bytes == 0) {
        break;
      }
    }
    if (r.rank() == root) {
      copyOwn(out, ins[root], bytes);
    }
    stores.done();
  });
}

}  // namespace tunedist::shm
