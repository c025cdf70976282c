// reduce: the root reads and reduces the peers' slots every round, pipelined through the double-buffered slots.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "shm/comm.h"

namespace tunedist::shm {

// reduce, per chunk of one slot:
//   1. every rank but the root copies its chunk into its slot;
//   2. publish; wait for all;
//   3. the root reduces all terms in rank order (its own straight from its input) into its output.
// Every round's copies into the slots use the stores the operation's RoundStoreChooser keeps for its size.
void ShmComm::reduce(const OpContext& ctx, const void* in, void* out, size_t count, const ReduceArgs& args, int root) {
  TD_CHECK(root >= 0 && root < size_, "tunedist: reduce (seq ", ctx.seq, ") on rank ", rank_, ": root ", root,
           " is outside the group of ", size_);
  checkReduceSupported(args.dtype, args.op);
  runOp(ctx, makeDesc(OpCode::kReduce, ctx.seq, count, root, args.dtype, args.op, args.factor), [&] {
    const size_t es = dtypeSize(args.dtype);
    const size_t chunk = options_.slotBytes / es;
    const char* inBytes = static_cast<const char*>(in);
    std::vector<const void*> srcs(static_cast<size_t>(size_));
    RoundStores stores(*this, kReduce, count * es, size_ > 1);
    for (size_t off = 0; off < count || off == 0; off += chunk) {
      const size_t n = std::min(chunk, count - off);
      int b = beginRound(ctx);
      if (rank_ != root) {
        copyIntoSlot(slot(rank_, b), inBytes + off * es, n * es);
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
    stores.done();
  });
}

}  // namespace tunedist::shm
