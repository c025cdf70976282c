// reduce_scatter from a symmetric input: every rank reduces its block reading the peers' inputs in place.
#include "core/error.h"
#include "shm/algorithms.h"
#include "shm/zero_copy/vote.h"

namespace tunedist::shm::zero_copy {

//   1. publish (our input is ready); wait for all; the descriptors agree that every input is symmetric;
//   2. reduce block `rank` of every rank's input, in rank order 0..P-1, into our output (which may be our own
//      block `rank`: no peer reads that block);
//   3. publish (we have read every peer's input); wait for all, so no rank returns while a peer still reads its
//      input.
void ZeroCopyCollectives::reduceScatter(const core::OpContext& ctx, const void* in, HeapRef inRef, void* out,
                                        size_t count, const kernels::ReduceArgs& args) {
  kernels::checkReduceSupported(args.dtype, args.op);
  const OpDesc desc = makeDesc(OpCode::kReduceScatter, ctx.seq, count, -1, args.dtype, args.op, args.factor);
  const size_t blockBytes = count * core::dtypeSize(args.dtype);
  const char* blocks = static_cast<const char*>(in);
  auto copyPath = [&] {
    RankPtrs ins(rounds_.size());
    for (int p = 0; p < rounds_.size(); ++p) {
      ins[p] = blocks + size_t(p) * blockBytes;
    }
    reduceScatterBody(rounds_, ctx, ins.data(), out, count, args);
  };
  runVoted(
      ctx, kReduceScatter, size_t(rounds_.size()) * blockBytes, desc, inRef,
      [&](bool /*streaming: one zero-copy path*/) {
        // Step 1/2: our input is complete; every peer may read its block of it.
        rounds_.syncRound(ctx);
        RankPtrs srcs(rounds_.size());
        for (int p = 0; p < rounds_.size(); ++p) {
          const char* base = p == rounds_.rank() ? blocks : peerBuffer(ctx, p, size_t(rounds_.size()) * blockBytes);
          srcs[p] = base + size_t(rounds_.rank()) * blockBytes;
        }
        kernels::reduce(args, out, srcs.data(), rounds_.size(), count);
        // Step 2/2: we have read every peer's input; each may return and reuse it.
        rounds_.syncRound(ctx);
      },
      copyPath);
}

}  // namespace tunedist::shm::zero_copy
