// all_reduce: one-shot for latency-bound sizes, pipelined reduce-scatter + all-gather for the rest.
#include <algorithm>

#include "core/error.h"
#include "shm/algorithms.h"
#include "shm/rounds.h"

namespace tunedist::shm {
namespace {

void allreduceOneShot(Rounds& r, const core::OpContext& ctx, const void* in, void* out, size_t count,
                      const kernels::ReduceArgs& args);
void allreduceTwoShot(Rounds& r, const core::OpContext& ctx, const void* in, void* out, size_t count,
                      const kernels::ReduceArgs& args);

}  // namespace

void allreduce(Rounds& r, const core::OpContext& ctx, const void* in, void* out, size_t count,
               const kernels::ReduceArgs& args) {
  kernels::checkReduceSupported(args.dtype, args.op);
  r.run(ctx, makeDesc(OpCode::kAllreduce, ctx.seq, count, -1, args.dtype, args.op, args.factor),
        [&] { allreduceCopy(r, ctx, in, out, count, args); });
}

void allreduceCopy(Rounds& r, const core::OpContext& ctx, const void* in, void* out, size_t count,
                   const kernels::ReduceArgs& args) {
  const size_t bytes = count * core::dtypeSize(args.dtype);
  if (r.size() == 1 || bytes <= r.options().oneShotMaxBytesFor(args.dtype)) {
    allreduceOneShot(r, ctx, in, out, count, args);
  } else {
    allreduceTwoShot(r, ctx, in, out, count, args);
  }
}

namespace {

// One-shot (latency-bound sizes, one synchronisation):
//   1. copy our whole input into our slot;
//   2. publish; wait for every rank's publish;
//   3. reduce all P terms in rank order 0..P-1 (our own straight from the input) into the output.
// Every rank does the same arithmetic in the same order, so every rank gets bit-identical results. The slot stores
// are those the operation's RoundStoreChooser keeps for its size (shm/round_stores.h).
void allreduceOneShot(Rounds& r, const core::OpContext& ctx, const void* in, void* out, size_t count,
                      const kernels::ReduceArgs& args) {
  const size_t bytes = count * core::dtypeSize(args.dtype);
  auto stores = r.stores(StorePolicy::kOneShotAllreduce, bytes);
  int b = r.beginRound(ctx);
  if (r.size() > 1) {
    stores.copyIn(r.slot(r.rank(), b), in, bytes);
  }
  // Step 1/1: our slot holds our input; peers may read [0, bytes) of it.
  r.waitAll(ctx, r.publish(ctx));
  RankPtrs srcs(r.size());
  for (int p = 0; p < r.size(); ++p) {
    srcs[p] = p == r.rank() ? in : r.slot(p, b);
  }
  kernels::reduce(args, out, srcs.data(), r.size(), count);
  stores.done();
  r.releaseBuffer(b);
}

// Two-shot, pipelined in chunks of one slot (bandwidth-bound sizes). Per chunk, with the chunk cut into P slices
// and slice q reduced by rank q:
//   1. copy the P-1 slices our peers reduce into our slot (our own slice stays in the input: no copy);
//   2. publish; wait for all;
//   3. reduce slice `rank` over all ranks in order 0..P-1 into the output, then copy it into our slot's slice;
//   4. publish; wait for all;
//   5. copy every peer's reduced slice from its slot into the output.
// Memory stays bounded by the slots whatever the tensor size. Each slice is reduced by exactly one rank, in
// rank order, so results are bit-identical everywhere and identical to the one-shot path. Both copies into our slot,
// in every chunk, use the stores the operation's RoundStoreChooser keeps for its size.
void allreduceTwoShot(Rounds& r, const core::OpContext& ctx, const void* in, void* out, size_t count,
                      const kernels::ReduceArgs& args) {
  const size_t es = core::dtypeSize(args.dtype);
  // A slice is at least one cache line: with fewer slot bytes per rank the chunk would be empty and never advance.
  TD_CHECK(r.options().slotBytes / size_t(r.size()) >= kCacheLine, "tunedist: all_reduce (seq ", ctx.seq, ") on rank ",
           r.rank(), ": ", r.size(), " ranks need slots of at least ", size_t(r.size()) * kCacheLine, " bytes, got ",
           r.options().slotBytes, " (raise TUNEDIST_SLOT_BYTES)");
  const size_t maxChunk = r.sliceElems(size_t(-1) / 2 / es, es) * size_t(r.size());
  const char* inBytes = static_cast<const char*>(in);
  char* outBytes = static_cast<char*>(out);
  RankPtrs srcs(r.size());
  auto stores = r.stores(StorePolicy::kTwoShotAllreduce, count * es);
  for (size_t off = 0; off < count || off == 0; off += maxChunk) {
    const size_t n = std::min(maxChunk, count - off);
    const size_t sc = r.sliceElems(n, es);
    auto sliceBegin = [&](int q) { return std::min(size_t(q) * sc, n); };
    auto sliceEnd = [&](int q) { return std::min(size_t(q + 1) * sc, n); };
    int b = r.beginRound(ctx);
    for (int q = 0; q < r.size(); ++q) {
      if (q != r.rank()) {
        stores.copyIn(r.slot(r.rank(), b) + size_t(q) * sc * es, inBytes + (off + sliceBegin(q)) * es,
                      (sliceEnd(q) - sliceBegin(q)) * es);
      }
    }
    // Step 1/2: slices q != rank of our input are in our slot; rank q may read slice q.
    r.waitAll(ctx, r.publish(ctx));
    const size_t mine = sliceBegin(r.rank());
    const size_t mineLen = sliceEnd(r.rank()) - mine;
    for (int p = 0; p < r.size(); ++p) {
      srcs[p] = p == r.rank() ? static_cast<const void*>(inBytes + (off + mine) * es)
                              : static_cast<const void*>(r.slot(p, b) + size_t(r.rank()) * sc * es);
    }
    kernels::reduce(args, outBytes + (off + mine) * es, srcs.data(), r.size(), mineLen);
    stores.copyIn(r.slot(r.rank(), b) + size_t(r.rank()) * sc * es, outBytes + (off + mine) * es, mineLen * es);
    // Step 2/2: our reduced slice is in our slot; every peer may copy it out.
    r.waitAll(ctx, r.publish(ctx));
    for (int q = 0; q < r.size(); ++q) {
      if (q != r.rank()) {
        kernels::copyBytesCached(outBytes + (off + sliceBegin(q)) * es, r.slot(q, b) + size_t(q) * sc * es,
                                 (sliceEnd(q) - sliceBegin(q)) * es);
      }
    }
    r.releaseBuffer(b);
    if (count == 0) {
      break;
    }
  }
  stores.done();
}

}  // namespace

}  // namespace tunedist::shm
