// all_reduce on symmetric buffers: every rank reduces its slice reading the peers' buffers in place, then copies
// the peers' reduced slices straight out of their buffers. No slot, no staging copy.
#include <algorithm>

#include "core/error.h"
#include "shm/comm.h"

namespace tunedist::shm {

// With the buffer cut into P cache-line-aligned slices and slice q reduced by rank q:
//   1. publish (our buffer holds our input); wait for all; the descriptors agree that every buffer is symmetric;
//   2. reduce slice `rank` of every rank's buffer, in rank order 0..P-1, into slice `rank` of our buffer (only we
//      read that slice of any buffer in this step, so reducing in place is safe);
//   3. publish (our slice holds the result); wait for all;
//   4. copy every peer's reduced slice from its buffer into ours;
//   5. publish (we have read every peer's buffer); wait for all, so no rank returns while a peer still reads its
//      buffer: a tensor the caller reuses right after wait() is safe.
// Each element is reduced once, over ranks 0..P-1 in order, as in the copying algorithms: results are
// bit-identical on every rank and to the copying path.
void ShmComm::allreduceSymmetric(const OpContext& ctx, void* buf, HeapRef ref, size_t count, const ReduceArgs& args) {
  checkReduceSupported(args.dtype, args.op);
  const OpDesc desc = makeDesc(OpCode::kAllreduce, ctx.seq, count, -1, args.dtype, args.op, args.factor);
  runSymmetric(
      ctx, desc, ref,
      [&] {
        const size_t es = dtypeSize(args.dtype);
        // Step 1/3: our buffer holds our input; every peer may read it.
        syncRound(ctx);
        std::vector<char*> bases(size_t(size_), nullptr);
        for (int p = 0; p < size_; ++p) {
          bases[size_t(p)] = p == rank_ ? static_cast<char*>(buf) : peerBuffer(ctx, p, count * es);
        }
        const size_t slice = roundUp((count + size_t(size_) - 1) / size_t(size_) * es, kCacheLine) / es;
        auto begin = [&](int q) { return std::min(size_t(q) * slice, count); };
        auto end = [&](int q) { return std::min(size_t(q + 1) * slice, count); };
        RankPtrs srcs(size_);
        for (int p = 0; p < size_; ++p) {
          srcs[p] = bases[size_t(p)] + begin(rank_) * es;
        }
        tunedist::shm::reduce(args, bases[size_t(rank_)] + begin(rank_) * es, srcs.data(), size_,
                              end(rank_) - begin(rank_));
        // Step 2/3: slice `rank` of our buffer holds the result; every peer may copy it.
        syncRound(ctx);
        for (int q = 0; q < size_; ++q) {
          if (q != rank_) {
            copyBytes(bases[size_t(rank_)] + begin(q) * es, bases[size_t(q)] + begin(q) * es, (end(q) - begin(q)) * es);
          }
        }
        // Step 3/3: we have read every peer's buffer; each may return and reuse it.
        syncRound(ctx);
      },
      [&] { allreduceCopy(ctx, buf, buf, count, args); });
}

}  // namespace tunedist::shm
