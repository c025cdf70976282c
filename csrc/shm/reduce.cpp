// reduce: the root reads and reduces the peers' slots every round, pipelined through the double-buffered slots.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "shm/algorithms.h"
#include "shm/rounds.h"

namespace tunedist::shm {

// reduce, per chunk of one slot:
//   1. every rank but the root copies its chunk into its slot;
//   2. publish; wait for all;
//   3. the root reduces all terms in rank order (its own straight from its input) into its output.
// Every round's copies into the slots use the stores the operation's RoundStoreChooser keeps for its size.
void reduce(Rounds& r, const core::OpContext& ctx, const void* in, void* out, size_t count,
            const kernels::ReduceArgs& args, int root) {
  TD_CHECK(root >= 0 && root < r.size(), "tunedist: reduce (seq ", ctx.seq, ") on rank ", r.rank(), ": root ", root,
           " is outside the group of ", r.size());
  kernels::checkReduceSupported(args.dtype, args.op);
  r.run(ctx, makeDesc(OpCode::kReduce, ctx.seq, count, root, args.dtype, args.op, args.factor), [&] {
    const size_t es = core::dtypeSize(args.dtype);
    const size_t chunk = r.options().slotBytes / es;
    const char* inBytes = static_cast<const char*>(in);
    std::vector<const void*> srcs(static_cast<size_t>(r.size()));
    auto stores = r.stores(StorePolicy::kReduce, count * es);
    for (size_t off = 0; off < count || off == 0; off += chunk) {
      const size_t n = std::min(chunk, count - off);
      int b = r.beginRound(ctx);
      if (r.rank() != root) {
        stores.copyIn(r.slot(r.rank(), b), inBytes + off * es, n * es);
      }
      // Step 1/1: our slot holds elements [off, off+n) of our input.
      r.waitAll(ctx, r.publish(ctx));
      if (r.rank() == root) {
        for (int p = 0; p < r.size(); ++p) {
          srcs[size_t(p)] = p == root ? static_cast<const void*>(inBytes + off * es) : r.slot(p, b);
        }
        kernels::reduce(args, static_cast<char*>(out) + off * es, srcs.data(), r.size(), n);
      }
      r.releaseBuffer(b);
      if (count == 0) {
        break;
      }
    }
    stores.done();
  });
}

}  // namespace tunedist::shm
