// all_gather and gather: every rank writes its chunk into its slot, then everyone (all_gather) or the root
// (gather) copies the peers' chunks out.
#include <algorithm>
#include <cstring>

#include "shm/comm.h"
#include "shm/error.h"

namespace tunedist::shm {
namespace {

// Our own block goes straight from input to output; memmove because callers may pass overlapping views.
void copyOwn(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes > 0) {
    std::memmove(dst, src, bytes);
  }
}

}  // namespace

// all_gather / gather, per chunk of one slot:
//   1. copy our chunk into our slot;
//   2. publish; wait for all;
//   3. copy each peer's chunk into its output block (gather: on the root only).
// Our own block is copied last, straight from the input, so an input that is a view into its own block of the
// output (FSDP2's in-place all-gather) is never overwritten before it is read.
void ShmComm::allgather(const OpContext& ctx, const void* in, size_t bytes, void* const* outs) {
  gatherTo(ctx, in, bytes, outs, -1);
}

void ShmComm::gather(const OpContext& ctx, const void* in, size_t bytes, void* const* outs, int root) {
  TD_CHECK(root >= 0 && root < size_, "tunedist: gather (seq ", ctx.seq, ") on rank ", rank_, ": root ", root,
           " is outside the group of ", size_);
  gatherTo(ctx, in, bytes, outs, root);
}

void ShmComm::gatherTo(const OpContext& ctx, const void* in, size_t bytes, void* const* outs, int root) {
  const bool all = root < 0;
  OpCode op = all ? OpCode::kAllgather : OpCode::kGather;
  runOp(ctx, makeDesc(op, ctx.seq, bytes, root), [&] {
    const bool receive = all || rank_ == root;
    const char* src = static_cast<const char*>(in);
    const size_t chunk = options_.slotBytes;
    for (size_t off = 0; off < bytes || off == 0; off += chunk) {
      const size_t n = std::min(chunk, bytes - off);
      int b = beginRound(ctx);
      if (all || rank_ != root) {
        copyBytes(slot(rank_, b), src + off, n);
      }
      // Step 1/1: our slot holds bytes [off, off+n) of our input.
      waitAll(ctx, publish(ctx));
      if (receive) {
        for (int p = 0; p < size_; ++p) {
          if (p != rank_) {
            copyBytes(static_cast<char*>(outs[p]) + off, slot(p, b), n);
          }
        }
      }
      releaseBuffer(b);
      if (bytes == 0) {
        break;
      }
    }
    if (receive) {
      copyOwn(outs[rank_], in, bytes);
    }
  });
}

// scatter, per round of one slot cut into P parts:
//   1. the root copies part q of every peer's block into part q of its slot;
//   2. publish; wait for all;
//   3. rank q copies part q out of the root's slot.
void ShmComm::scatter(const OpContext& ctx, const void* const* ins, void* out, size_t bytes, int root) {
  TD_CHECK(root >= 0 && root < size_, "tunedist: scatter (seq ", ctx.seq, ") on rank ", rank_, ": root ", root,
           " is outside the group of ", size_);
  runOp(ctx, makeDesc(OpCode::kScatter, ctx.seq, bytes, root), [&] {
    const size_t part = (options_.slotBytes / size_t(size_)) / kCacheLine * kCacheLine;
    TD_CHECK(part > 0, "tunedist: scatter: slot too small for ", size_, " ranks");
    for (size_t off = 0; off < bytes || off == 0; off += part) {
      const size_t n = std::min(part, bytes - off);
      int b = beginRound(ctx);
      if (rank_ == root) {
        for (int q = 0; q < size_; ++q) {
          if (q != root) {
            copyBytes(slot(root, b) + size_t(q) * part, static_cast<const char*>(ins[q]) + off, n);
          }
        }
      }
      // Step 1/1: part q of the root's slot holds bytes [off, off+n) of rank q's block.
      waitAll(ctx, publish(ctx));
      if (rank_ != root) {
        copyBytes(static_cast<char*>(out) + off, slot(root, b) + size_t(rank_) * part, n);
      }
      releaseBuffer(b);
      if (bytes == 0) {
        break;
      }
    }
    if (rank_ == root) {
      copyOwn(out, ins[root], bytes);
    }
  });
}

}  // namespace tunedist::shm
