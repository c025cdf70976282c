// all_gather into symmetric outputs: every rank writes its input straight into every peer's output.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "shm/algorithms.h"
#include "shm/zero_copy/vote.h"

namespace tunedist::shm::zero_copy {

namespace {
// On the streaming path, from here up, the own block is streamed to memory too (no read-for-ownership of the
// destination): a block this large leaves the core's cache before anybody reads it. Below it, the cached copy
// (memmove) is faster for the caller's next read. 2 ranks of a 2-vCPU Intel Xeon with AVX-512, out of place (3 runs
// each; docs/performance.md#symmetric-buffers): streaming took the 64 MiB all_gather from 0.68-0.75 to 0.64-0.69 of the
// copying path's time; streaming at 1 MiB too was slower (0.64-0.70 against 0.47-0.52).
constexpr size_t kStreamOwnBlockBytes = size_t{4} << 20;
// The input goes to every destination 64 KiB at a time, so it is read from memory once and from cache for the
// other destinations: 64 MiB out of place went from 0.64-0.69 to 0.51-0.54 of the copying path's time (3 runs each).
constexpr size_t kPushBlockBytes = size_t{64} << 10;
}  // namespace

//   1. publish (we are in the operation: peers may write into our output); wait for all; the descriptors agree that
//      every output is symmetric;
//   2. write our input into block `rank` of every rank's output: ours (nothing to do for FSDP2's in-place
//      all-gather, whose input is that block) and each peer's, with the stores the path names, 64 KiB of input at a
//      time;
//   3. publish (our block is in every output); wait for all: every output is complete, and no rank returns while a
//      peer still writes into its output.
// Pushing reads our input (local, often still in cache) instead of a peer's freshly written block out of the
// peer's cache. Our input must not overlap a peer's block of our output, which peers write meanwhile (the backend
// passes a copy of such an input: cpu::unaliasedSource).
void ZeroCopyCollectives::allgather(const core::OpContext& ctx, const void* in, size_t bytes, void* out,
                                    HeapRef outRef) {
  const OpDesc desc = makeDesc(OpCode::kAllgather, ctx.seq, bytes, -1);
  char* blocks = static_cast<char*>(out);
  auto copyPath = [&] {
    RankPtrs outs(rounds_.size());
    for (int p = 0; p < rounds_.size(); ++p) {
      outs[p] = blocks + size_t(p) * bytes;
    }
    gatherBody(rounds_, ctx, in, bytes, const_cast<void* const*>(outs.data()), -1);
  };
  runVoted(
      ctx, kAllgather, size_t(rounds_.size()) * bytes, desc, outRef,
      [&](bool streaming) {
        // Step 1/2: every rank is in the operation; its output may be written.
        rounds_.syncRound(ctx);
        const char* src = static_cast<const char*>(in);
        char* own = blocks + size_t(rounds_.rank()) * bytes;
        const bool streamOwn = streaming && bytes >= kStreamOwnBlockBytes && (src + bytes <= own || own + bytes <= src);
        std::vector<char*> peers(size_t(rounds_.size()), nullptr);  // block `rank` of each peer's output
        for (int q = 0; q < rounds_.size(); ++q) {
          if (q != rounds_.rank()) {
            peers[size_t(q)] = peerBuffer(ctx, q, size_t(rounds_.size()) * bytes) + size_t(rounds_.rank()) * bytes;
          }
        }
        for (size_t off = 0; off < bytes; off += kPushBlockBytes) {
          const size_t n = std::min(kPushBlockBytes, bytes - off);
          for (int q = 0; q < rounds_.size(); ++q) {
            if (q != rounds_.rank()) {
              if (streaming) {
                kernels::copyBytes(peers[size_t(q)] + off, src + off, n);
              } else {
                kernels::copyBytesCached(peers[size_t(q)] + off, src + off, n);
              }
            }
          }
          if (streamOwn) {
            kernels::copyBytes(own + off, src + off, n);
          }
        }
        if (!streamOwn) {
          copyOwn(own, src, bytes);  // cached; nothing to do in place; memmove for a partial overlap
        }
        // Step 2/2: our block is in every output; once all have arrived, every output is complete.
        rounds_.syncRound(ctx);
      },
      copyPath);
}

}  // namespace tunedist::shm::zero_copy
