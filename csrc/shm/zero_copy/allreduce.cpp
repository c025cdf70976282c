// all_reduce on symmetric buffers: every rank reduces its slice reading the peers' buffers in place and writes the
// result straight into every buffer. No slot, no staging copy, two synchronisations.
#include <algorithm>

#include "core/error.h"
#include "shm/algorithms.h"
#include "shm/zero_copy/vote.h"

namespace tunedist::shm::zero_copy {

namespace {
// The reduce-then-push unit: small enough that the reduced block is still in this core's cache when it is
// written to the peers, large enough that the per-block calls cost nothing measurable.
constexpr size_t kPushBlockBytes = size_t{64} << 10;
}  // namespace

// With the buffer cut into P cache-line-aligned slices and slice q owned by rank q (only rank q reads or writes
// slice q of any buffer between the two synchronisations, so every step below is race-free):
//   1. publish (our buffer holds our input); wait for all; the descriptors agree that every buffer is symmetric;
//   2. block by block through slice `rank`: reduce the block of every rank's buffer, in rank order 0..P-1, into
//      our buffer (in place), then write the result into the same block of every peer's buffer, with the stores the
//      path names (cached: the result stays in the shared cache, where the peer reads it next; streaming: to memory);
//   3. publish (we have read every peer's slice `rank` and written our result into it); wait for all: every
//      buffer now holds every slice's result, and no rank returns while a peer still reads or writes its buffer
//      (a tensor the caller reuses right after wait() is safe).
// Each rank reads N bytes and writes N (the 3-round variant that copied peers' reduced slices out moved
// N(3P-1)/P). Each element is reduced once, over ranks 0..P-1 in order, as in the copying algorithms: results are
// bit-identical on every rank and to the copying path.
void ZeroCopyCollectives::allreduce(const core::OpContext& ctx, void* buf, HeapRef ref, size_t count,
                                    const kernels::ReduceArgs& args) {
  kernels::checkReduceSupported(args.dtype, args.op);
  const OpDesc desc = makeDesc(OpCode::kAllreduce, ctx.seq, count, -1, args.dtype, args.op, args.factor);
  const size_t es = core::dtypeSize(args.dtype);
  runVoted(
      ctx, kAllreduce, count * es, desc, ref,
      [&](bool streaming) {
        // Step 1/2: our buffer holds our input; every peer may read and write its slice of it.
        rounds_.syncRound(ctx);
        std::vector<char*> bases(size_t(rounds_.size()), nullptr);
        for (int p = 0; p < rounds_.size(); ++p) {
          bases[size_t(p)] = p == rounds_.rank() ? static_cast<char*>(buf) : peerBuffer(ctx, p, count * es);
        }
        const size_t slice = roundUp((count + size_t(rounds_.size()) - 1) / size_t(rounds_.size()) * es, kCacheLine) /
                             es;
        const size_t first = std::min(size_t(rounds_.rank()) * slice, count);
        const size_t last = std::min(first + slice, count);
        const size_t block = std::max<size_t>(1, kPushBlockBytes / es);
        RankPtrs srcs(rounds_.size());
        for (size_t b = first; b < last; b += block) {
          const size_t n = std::min(block, last - b);
          for (int p = 0; p < rounds_.size(); ++p) {
            srcs[p] = bases[size_t(p)] + b * es;
          }
          char* mine = bases[size_t(rounds_.rank())] + b * es;
          kernels::reduce(args, mine, srcs.data(), rounds_.size(), n);
          for (int q = 0; q < rounds_.size(); ++q) {
            if (q != rounds_.rank()) {
              if (streaming) {
                kernels::copyBytes(bases[size_t(q)] + b * es, mine, n * es);
              } else {
                kernels::copyBytesCached(bases[size_t(q)] + b * es, mine, n * es);
              }
            }
          }
        }
        // Step 2/2: every buffer holds our slice's result and we read none of them any more; once all have
        // arrived, every buffer is complete and each rank may return and reuse it.
        rounds_.syncRound(ctx);
      },
      [&] { allreduceCopy(rounds_, ctx, buf, buf, count, args); });
}

}  // namespace tunedist::shm::zero_copy
