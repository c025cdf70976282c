// gather: every rank writes its chunk into its slot, the root copies the peers' chunks out. gatherTo is shared
// with all_gather (root -1).
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "shm/comm.h"

namespace tunedist::shm {

void ShmComm::gather(const OpContext& ctx, const void* in, size_t bytes, void* const* outs, int root) {
  TD_CHECK(root >= 0 && root < size_, "tunedist: gather (seq ", ctx.seq, ") on rank ", rank_, ": root ", root,
           " is outside the group of ", size_);
  gatherTo(ctx, in, bytes, outs, root);
}

void ShmComm::gatherTo(const OpContext& ctx, const void* in, size_t bytes, void* const* outs, int root) {
  const bool all = root < 0;
  OpCode op = all ? OpCode::kAllgather : OpCode::kGather;
  runOp(ctx, makeDesc(op, ctx.seq, bytes, root), [&] { gatherBody(ctx, in, bytes, outs, root); });
}

void ShmComm::gatherBody(const OpContext& ctx, const void* in, size_t bytes, void* const* outs, int root) {
  const bool all = root < 0;
  const bool receive = all || rank_ == root;
  const char* src = static_cast<const char*>(in);
  char* own = receive ? static_cast<char*>(outs[rank_]) : nullptr;
  // Our own block is copied while the peers catch up (between publishing and waiting), unless the input overlaps
  // it without being it: then a chunk's copy could overwrite input that a later chunk still has to read, so the
  // block goes last, in one memmove.
  const bool ownEarly = receive && (own == src || !rangesOverlap(own, src, bytes));
  // A rank that writes its slot and copies its own block reads its input once for both (copyIntoSlotAndOwn), before
  // publishing: when ranks are in step, the pass costs less than the two copies it replaces (shm/copy_in.h).
  const bool writesSlot = (all || rank_ != root) && size_ > 1;
  const bool fused = writesSlot && ownEarly && own != src && bytes >= options_.fusedOwnCopyMinBytes;
  // What the operation receives decides the stores of its output: the peers' blocks stream above cachedCopyMaxBytes
  // (copyOut), our own block above ownCachedCopyMaxBytes (where the ranges allow: not for the overlapping late copy).
  const size_t received = bytes * size_t(size_ - 1);
  const bool streamOwn = ownEarly && received > options_.ownCachedCopyMaxBytes;
  const size_t chunk = options_.slotBytes;
  // Every round's copies into the slots use the stores the operation's RoundStoreChooser keeps for its size.
  RoundStores stores(*this, all ? kAllgather : kGather, bytes, size_ > 1);
  for (size_t off = 0; off < bytes || off == 0; off += chunk) {
    const size_t n = std::min(chunk, bytes - off);
    int b = beginRound(ctx);
    // With no peer (a group of one) nobody reads the slot.
    bool ownCopied = false;
    if (fused) {
      ownCopied = copyIntoSlotAndOwn(slot(rank_, b), own + off, src + off, n, streamOwn);
    } else if (writesSlot) {
      copyIntoSlot(slot(rank_, b), src + off, n);
    }
    // Step 1/1: our slot holds bytes [off, off+n) of our input.
    const uint64_t step = publish(ctx);
    if (ownEarly && !ownCopied) {
      copyOwn(own + off, src + off, n, streamOwn);
    }
    waitAll(ctx, step);
    if (receive) {
      for (int p = 0; p < size_; ++p) {
        if (p != rank_) {
          copyOut(static_cast<char*>(outs[p]) + off, slot(p, b), n, received);
        }
      }
    }
    releaseBuffer(b);
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
