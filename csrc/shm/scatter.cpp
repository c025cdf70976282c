// scatter: the root writes each peer's part into its slot, every peer copies its part out.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "shm/comm.h"

namespace tunedist::shm {

// scatter, per round of one slot cut into P parts:
//   1. the root copies part q of every peer's block into part q of its slot;
//   2. publish; wait for all;
//   3. rank q copies part q out of the root's slot.
// Every round's copies into the slot use the stores the operation's RoundStoreChooser keeps for its size.
void ShmComm::scatter(const OpContext& ctx, const void* const* ins, void* out, size_t bytes, int root) {
  TD_CHECK(root >= 0 && root < size_, "tunedist: scatter (seq ", ctx.seq, ") on rank ", rank_, ": root ", root,
           " is outside the group of ", size_);
  runOp(ctx, makeDesc(OpCode::kScatter, ctx.seq, bytes, root), [&] {
    const size_t part = slotPartBytes();
    TD_CHECK(part > 0, "tunedist: scatter: slot too small for ", size_, " ranks");
    RoundStores stores(*this, kScatter, bytes * size_t(size_ - 1), size_ > 1);
    for (size_t off = 0; off < bytes || off == 0; off += part) {
      const size_t n = std::min(part, bytes - off);
      int b = beginRound(ctx);
      if (rank_ == root) {
        for (int q = 0; q < size_; ++q) {
          if (q != root) {
            copyIntoSlot(slot(root, b) + size_t(q) * part, static_cast<const char*>(ins[q]) + off, n);
          }
        }
      }
      // Step 1/1: part q of the root's slot holds bytes [off, off+n) of rank q's block.
      waitAll(ctx, publish(ctx));
      if (rank_ != root) {
        copyOut(static_cast<char*>(out) + off, slot(root, b) + size_t(rank_) * part, n, bytes);
      }
      releaseBuffer(b);
      if (bytes == 0) {
        break;
      }
    }
    if (rank_ == root) {
      copyOwn(out, ins[root], bytes);
    }
    stores.done();
  });
}

}  // namespace tunedist::shm
