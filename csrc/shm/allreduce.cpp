// all_reduce: one-shot for latency-bound sizes, pipelined reduce-scatter + all-gather for the rest.
#include <algorithm>

#include "core/error.h"
#include "shm/comm.h"

namespace tunedist::shm {

void ShmComm::allreduce(const OpContext& ctx, const void* in, void* out, size_t count, const ReduceArgs& args) {
  checkReduceSupported(args.dtype, args.op);
  runOp(ctx, makeDesc(OpCode::kAllreduce, ctx.seq, count, -1, args.dtype, args.op, args.factor),
        [&] { allreduceCopy(ctx, in, out, count, args); });
}

void ShmComm::allreduceCopy(const OpContext& ctx, const void* in, void* out, size_t count, const ReduceArgs& args) {
  const size_t bytes = count * dtypeSize(args.dtype);
  if (size_ == 1 || bytes <= options_.oneShotMaxBytesFor(args.dtype)) {
    allreduceOneShot(ctx, in, out, count, args);
  } else {
    allreduceTwoShot(ctx, in, out, count, args);
  }
}

// One-shot (latency-bound sizes, one synchronisation):
//   1. copy our whole input into our slot;
//   2. publish; wait for every rank's publish;
//   3. reduce all P terms in rank order 0..P-1 (our own straight from the input) into the output.
// Every rank does the same arithmetic in the same order, so every rank gets bit-identical results. The slot stores
// are those the operation's RoundStoreChooser keeps for its size (shm/round_stores.h).
void ShmComm::allreduceOneShot(const OpContext& ctx, const void* in, void* out, size_t count, const ReduceArgs& args) {
  const size_t bytes = count * dtypeSize(args.dtype);
  RoundStores stores(*this, kOneShotAllreduce, bytes, size_ > 1);
  int b = beginRound(ctx);
  if (size_ > 1) {
    copyIntoSlot(slot(rank_, b), in, bytes);
  }
  // Step 1/1: our slot holds our input; peers may read [0, bytes) of it.
  waitAll(ctx, publish(ctx));
  RankPtrs srcs(size_);
  for (int p = 0; p < size_; ++p) {
    srcs[p] = p == rank_ ? in : slot(p, b);
  }
  tunedist::shm::reduce(args, out, srcs.data(), size_, count);
  stores.done();
  releaseBuffer(b);
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
void ShmComm::allreduceTwoShot(const OpContext& ctx, const void* in, void* out, size_t count, const ReduceArgs& args) {
  const size_t es = dtypeSize(args.dtype);
  // A slice is at least one cache line: with fewer slot bytes per rank the chunk would be empty and never advance.
  TD_CHECK(options_.slotBytes / size_t(size_) >= kCacheLine, "tunedist: all_reduce (seq ", ctx.seq, ") on rank ", rank_,
           ": ", size_, " ranks need slots of at least ", size_t(size_) * kCacheLine, " bytes, got ",
           options_.slotBytes, " (raise TUNEDIST_SLOT_BYTES)");
  const size_t maxChunk = sliceElems(size_t(-1) / 2 / es, es) * size_t(size_);
  const char* inBytes = static_cast<const char*>(in);
  char* outBytes = static_cast<char*>(out);
  RankPtrs srcs(size_);
  RoundStores stores(*this, kTwoShotAllreduce, count * es, size_ > 1);
  for (size_t off = 0; off < count || off == 0; off += maxChunk) {
    const size_t n = std::min(maxChunk, count - off);
    const size_t sc = sliceElems(n, es);
    auto sliceBegin = [&](int q) { return std::min(size_t(q) * sc, n); };
    auto sliceEnd = [&](int q) { return std::min(size_t(q + 1) * sc, n); };
    int b = beginRound(ctx);
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) {
        copyIntoSlot(slot(rank_, b) + size_t(q) * sc * es, inBytes + (off + sliceBegin(q)) * es,
                     (sliceEnd(q) - sliceBegin(q)) * es);
      }
    }
    // Step 1/2: slices q != rank of our input are in our slot; rank q may read slice q.
    waitAll(ctx, publish(ctx));
    const size_t mine = sliceBegin(rank_);
    const size_t mineLen = sliceEnd(rank_) - mine;
    for (int p = 0; p < size_; ++p) {
      srcs[p] = p == rank_ ? static_cast<const void*>(inBytes + (off + mine) * es)
                           : static_cast<const void*>(slot(p, b) + size_t(rank_) * sc * es);
    }
    tunedist::shm::reduce(args, outBytes + (off + mine) * es, srcs.data(), size_, mineLen);
    copyIntoSlot(slot(rank_, b) + size_t(rank_) * sc * es, outBytes + (off + mine) * es, mineLen * es);
    // Step 2/2: our reduced slice is in our slot; every peer may copy it out.
    waitAll(ctx, publish(ctx));
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) {
        copyBytesCached(outBytes + (off + sliceBegin(q)) * es, slot(q, b) + size_t(q) * sc * es,
                        (sliceEnd(q) - sliceBegin(q)) * es);
      }
    }
    releaseBuffer(b);
    if (count == 0) {
      break;
    }
  }
  stores.done();
}

}  // namespace tunedist::shm
