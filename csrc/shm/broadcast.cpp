// broadcast and reduce: one root writes (broadcast) or reads (reduce) every round, pipelined through the
// double-buffered slots.
#include <algorithm>
#include <vector>

#include "shm/comm.h"
#include "shm/error.h"

namespace tunedist::shm {

// broadcast, per chunk of one slot:
//   1. the root copies the chunk into its slot;
//   2. everyone publishes; everyone waits for all (the root's publish is the one that matters);
//   3. the others copy the chunk out of the root's slot.
// Double buffering lets the root fill the next chunk while the others still copy the previous one.
void ShmComm::broadcast(const OpContext& ctx, void* buf, size_t bytes, int root) {
  TD_CHECK(root >= 0 && root < size_, "tunedist: broadcast (seq ", ctx.seq, ") on rank ", rank_, ": root ", root,
           " is outside the group of ", size_);
  runOp(ctx, makeDesc(OpCode::kBroadcast, ctx.seq, bytes, root), [&] {
    char* data = static_cast<char*>(buf);
    const size_t chunk = options_.slotBytes;
    for (size_t off = 0; off < bytes || off == 0; off += chunk) {
      const size_t n = std::min(chunk, bytes - off);
      int b = beginRound(ctx);
      if (rank_ == root) {
        copyBytes(slot(root, b), data + off, n);
      }
      // Step 1/1: the root's slot holds bytes [off, off+n).
      waitAll(ctx, publish(ctx));
      if (rank_ != root) {
        copyBytes(data + off, slot(root, b), n);
      }
      releaseBuffer(b);
      if (bytes == 0) {
        break;
      }
    }
  });
}

// reduce, per chunk of one slot:
//   1. every rank but the root copies its chunk into its slot;
//   2. publish; wait for all;
//   3. the root reduces all terms in rank order (its own straight from its input) into its output.
void ShmComm::reduce(const OpContext& ctx, const void* in, void* out, size_t count, const ReduceArgs& args,
                     int root) {
  TD_CHECK(root >= 0 && root < size_, "tunedist: reduce (seq ", ctx.seq, ") on rank ", rank_, ": root ", root,
           " is outside the group of ", size_);
  checkReduceSupported(args.dtype, args.op);
  runOp(ctx, makeDesc(OpCode::kReduce, ctx.seq, count, root, args.dtype, args.op, args.factor), [&] {
    const size_t es = dtypeSize(args.dtype);
    const size_t chunk = options_.slotBytes / es;
    const char* inBytes = static_cast<const char*>(in);
    std::vector<const void*> srcs(static_cast<size_t>(size_));
    for (size_t off = 0; off < count || off == 0; off += chunk) {
      const size_t n = std::min(chunk, count - off);
      int b = beginRound(ctx);
      if (rank_ != root) {
        copyBytes(slot(rank_, b), inBytes + off * es, n * es);
      }
      // Step 1/1: our slot holds elements [off, off+n) of our input.
      waitAll(ctx, publish(ctx));
      if (rank_ == root) {
        for (int p = 0; p < size_; ++p) {
          srcs[size_t(p)] = p == root ? static_cast<const void*>(inBytes + off * es) : slot(p, b);
        }
        tunedist::shm::reduce(args, static_cast<char*>(out) + off * es, srcs.data(), size_, n);
      }
      releaseBuffer(b);
      if (count == 0) {
        break;
      }
    }
  });
}

}  // namespace tunedist::shm
