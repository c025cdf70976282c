// reduce_scatter: rank q ends with the reduction over all ranks of their block q.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "shm/algorithms.h"
#include "shm/rounds.h"

namespace tunedist::shm {

// Per round of one slot cut into P parts:
//   1. copy part of each block q != rank into part q of our slot (our own block stays in place);
//   2. publish; wait for all;
//   3. reduce our block over all ranks, in rank order, into the output.
// The output may be our own input block (in place); each element is read before it is written.
void reduceScatter(Rounds& r, const core::OpContext& ctx, const void* const* ins, void* out, size_t count,
                   const kernels::ReduceArgs& args) {
  kernels::checkReduceSupported(args.dtype, args.op);
  r.run(ctx, makeDesc(OpCode::kReduceScatter, ctx.seq, count, -1, args.dtype, args.op, args.factor),
        [&] { reduceScatterBody(r, ctx, ins, out, count, args); });
}

void reduceScatterBody(Rounds& r, const core::OpContext& ctx, const void* const* ins, void* out, size_t count,
                       const kernels::ReduceArgs& args) {
  const size_t es = core::dtypeSize(args.dtype);
  const size_t partBytes = r.slotPartBytes();
  const size_t part = partBytes / es;
  TD_CHECK(part > 0, "tunedist: reduce_scatter: slot too small for ", r.size(), " ranks");
  std::vector<const void*> srcs(static_cast<size_t>(r.size()));
  // Every round's stores are the RoundStoreChooser's, for the size class of all that we write into our slot.
  auto stores = r.stores(StorePolicy::kReduceScatter, count * es * size_t(r.size() - 1));
  for (size_t off = 0; off < count || off == 0; off += part) {
    const size_t n = std::min(part, count - off);
    int b = r.beginRound(ctx);
    for (int q = 0; q < r.size(); ++q) {
      if (q != r.rank()) {
        stores.copyIn(r.slot(r.rank(), b) + size_t(q) * partBytes, static_cast<const char*>(ins[q]) + off * es, n * es);
      }
    }
    // Step 1/1: part q of our slot holds elements [off, off+n) of our block q.
    r.waitAll(ctx, r.publish(ctx));
    for (int p = 0; p < r.size(); ++p) {
      srcs[size_t(p)] = p == r.rank() ? static_cast<const void*>(static_cast<const char*>(ins[p]) + off * es)
                                      : static_cast<const void*>(r.slot(p, b) + size_t(r.rank()) * partBytes);
    }
    kernels::reduce(args, static_cast<char*>(out) + off * es, srcs.data(), r.size(), n);
    r.releaseBuffer(b);
    if (count == 0) {
      break;
    }
  }
  stores.done();
}

}  // namespace tunedist::shm
