// all_to_all with per-pair sizes (even and uneven splits).
#include <algorithm>
#include <cstring>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "shm/comm.h"

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
void ShmComm::alltoallv(const OpContext& ctx, const void* const* sends, const size_t* sendBytes, void* const* recvs,
                        const size_t* recvBytes) {
  // Each rank's part of a slot must hold at least one cache line (and round 0's 2P sizes fit then too).
  TD_CHECK(options_.slotBytes / size_t(size_) >= kCacheLine, "tunedist: all_to_all: ", size_,
           " ranks need slots of at least ", size_t(size_) * kCacheLine, " bytes, got ", options_.slotBytes,
           " (raise TUNEDIST_SLOT_BYTES)");
  runOp(ctx, makeDesc(OpCode::kAlltoall, ctx.seq, 0, -1), [&] {
    // Round 0: sizes.
    int b = beginRound(ctx);
    auto* mine = reinterpret_cast<uint64_t*>(slot(rank_, b));
    for (int q = 0; q < size_; ++q) {
      mine[q] = sendBytes[q];
      mine[size_ + q] = recvBytes[q];
    }
    // Step 1: our send sizes [0, P) and receive sizes [P, 2P) are in our slot.
    waitAll(ctx, publish(ctx));
    size_t largest = 0;
    std::ostringstream bad;
    for (int s = 0; s < size_; ++s) {
      const auto* fromS = reinterpret_cast<const uint64_t*>(slot(s, b));
      for (int d = 0; d < size_; ++d) {
        const auto* atD = reinterpret_cast<const uint64_t*>(slot(d, b));
        if (fromS[d] != atD[size_ + s] && bad.tellp() < 400) {
          bad << (bad.tellp() > 0 ? "; " : "") << "rank " << s << " sends " << fromS[d] << " bytes to rank " << d
              << ", which expects " << atD[size_ + s];
        }
        largest = std::max<size_t>(largest, fromS[d]);
      }
    }
    releaseBuffer(b);
    if (bad.tellp() > 0) {
      fail(ctx,
           detail::str("split sizes disagree: ", bad.str(), ". input_split_sizes on each rank must match ",
                       "output_split_sizes on its peers."),
           false, false);
    }
    const size_t part = slotPartBytes();
    RoundStores stores(*this, kAlltoall, largest * size_t(size_), size_ > 1);
    size_t received = 0;
    for (int q = 0; q < size_; ++q) {
      received += q != rank_ ? recvBytes[q] : 0;
    }
    for (size_t off = 0; off < largest; off += part) {
      b = beginRound(ctx);
      for (int q = 0; q < size_; ++q) {
        if (q != rank_ && off < sendBytes[q]) {
          copyIntoSlot(slot(rank_, b) + size_t(q) * part, static_cast<const char*>(sends[q]) + off,
                       std::min(part, sendBytes[q] - off));
        }
      }
      // Step: part q of our slot holds bytes [off, off+part) of our block for rank q.
      waitAll(ctx, publish(ctx));
      for (int q = 0; q < size_; ++q) {
        if (q != rank_ && off < recvBytes[q]) {
          copyOut(static_cast<char*>(recvs[q]) + off, slot(q, b) + size_t(rank_) * part,
                  std::min(part, recvBytes[q] - off), received);
        }
      }
      releaseBuffer(b);
    }
    if (recvs[rank_] != sends[rank_] && sendBytes[rank_] > 0) {
      std::memmove(recvs[rank_], sends[rank_], sendBytes[rank_]);
    }
    stores.done();
  });
}

}  // namespace tunedist::shm
