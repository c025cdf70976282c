// all_to_all with per-pair sizes (even and uneven splits).
#include <algorithm>
#include <cstring>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "shm/algorithms.h"
#include "shm/rounds.h"

namespace tunedist::shm {

// all_to_all:
//   round 0: every rank writes the sizes it sends to and expects from each peer into its slot; publish; wait;
//            every rank checks every pair (s -> d sends what d expects from s), so a mismatch fails everywhere;
//   rounds 1..R, R = ceil(largest pair / part), with the slot cut into P parts:
//     1. copy the next piece of the block for each peer q into part q of our slot;
//     2. publish; wait for all;
//     3. copy part `rank` of each peer's slot into our receive block from that peer.
// Our own block is copied directly from the send to the receive buffer. Rounds 1..R copy into the slots with the
// stores the operation's RoundStoreChooser keeps for P x the largest pair, a size every rank knows after round 0.
void alltoallv(Rounds& r, const core::OpContext& ctx, const void* const* sends, const size_t* sendBytes,
               void* const* recvs, const size_t* recvBytes) {
  // Each rank's part of a slot must hold at least one cache line (and round 0's 2P sizes fit then too).
  TD_CHECK(r.options().slotBytes / size_t(r.size()) >= kCacheLine, "tunedist: all_to_all: ", r.size(),
           " ranks need slots of at least ", size_t(r.size()) * kCacheLine, " bytes, got ", r.options().slotBytes,
           " (raise TUNEDIST_SLOT_BYTES)");
  r.run(ctx, makeDesc(OpCode::kAlltoall, ctx.seq, 0, -1), [&] {
    // Round 0: sizes.
    int b = r.beginRound(ctx);
    auto* mine = reinterpret_cast<uint64_t*>(r.slot(r.rank(), b));
    for (int q = 0; q < r.size(); ++q) {
      mine[q] = sendBytes[q];
      mine[r.size() + q] = recvBytes[q];
    }
    // Step 1: our send sizes [0, P) and receive sizes [P, 2P) are in our slot.
    r.waitAll(ctx, r.publish(ctx));
    size_t largest = 0;
    std::ostringstream bad;
    for (int s = 0; s < r.size(); ++s) {
      const auto* fromS = reinterpret_cast<const uint64_t*>(r.slot(s, b));
      for (int d = 0; d < r.size(); ++d) {
        const auto* atD = reinterpret_cast<const uint64_t*>(r.slot(d, b));
        if (fromS[d] != atD[r.size() + s] && bad.tellp() < 400) {
          bad << (bad.tellp() > 0 ? "; " : "") << "rank " << s << " sends " << fromS[d] << " bytes to rank " << d
              << ", which expects " << atD[r.size() + s];
        }
        largest = std::max<size_t>(largest, fromS[d]);
      }
    }
    r.releaseBuffer(b);
    if (bad.tellp() > 0) {
      r.segment().fail(ctx,
                       core::detail::str("split sizes disagree: ", bad.str(),
                                         ". input_split_sizes on each rank must match ",
                                         "output_split_sizes on its peers."),
                       false, false);
    }
    const size_t part = r.slotPartBytes();
    auto stores = r.stores(StorePolicy::kAlltoall, largest * size_t(r.size()));
    size_t received = 0;
    for (int q = 0; q < r.size(); ++q) {
      received += q != r.rank() ? recvBytes[q] : 0;
    }
    for (size_t off = 0; off < largest; off += part) {
      b = r.beginRound(ctx);
      for (int q = 0; q < r.size(); ++q) {
        if (q != r.rank() && off < sendBytes[q]) {
          stores.copyIn(r.slot(r.rank(), b) + size_t(q) * part, static_cast<const char*>(sends[q]) + off,
                        std::min(part, sendBytes[q] - off));
        }
      }
      // Step: part q of our slot holds bytes [off, off+part) of our block for rank q.
      r.waitAll(ctx, r.publish(ctx));
      for (int q = 0; q < r.size(); ++q) {
        if (q != r.rank() && off < recvBytes[q]) {
          copyOut(static_cast<char*>(recvs[q]) + off, r.slot(q, b) + size_t(r.rank()) * part,
                  std::min(part, recvBytes[q] - off), received, r.options().cachedCopyMaxBytes);
        }
      }
      r.releaseBuffer(b);
    }
    if (recvs[r.rank()] != sends[r.rank()] && sendBytes[r.rank()] > 0) {
      std::memmove(recvs[r.rank()], sends[r.rank()], sendBytes[r.rank()]);
    }
    stores.done();
  });
}

}  // namespace tunedist::shm
