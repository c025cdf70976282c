// The rendezvous of a symmetric allocation (torch's symm_mem.rendezvous, c10d windows): each rank learns where
// every peer's buffer lies and maps it, so that later loads and stores reach peers' memory with no operation at all.
#include "core/error.h"
#include "shm/descriptor.h"
#include "shm/rounds.h"
#include "shm/zero_copy/zero_copy.h"

namespace tunedist::shm::zero_copy {

// 1. Write our descriptor with the buffer's place (symChunk, symOffset) and its size as the count; list our heap's
//    new chunks in our HeapTable before publishing, so a peer that sees our step can map the chunk it names.
// 2. publish; wait for all: the first wait compares the descriptors (every rank exchanges a buffer of the same
//    size, else the group fails naming the ranks that differ); map each peer's buffer from its descriptor.
// 3. publish; wait for all: every rank has read the descriptors, so the next operation may overwrite them.
// No byte of the buffers moves: this only makes the mappings, which stay until the communicator ends.
SymmetricPeers ZeroCopyCollectives::exchange(const core::OpContext& ctx, void* buf, HeapRef ref, size_t bytes) {
  const int size = rounds_.size();
  SymmetricPeers peers;
  peers.segment = &segment_;
  peers.bases.assign(size_t(size), nullptr);
  peers.bases[size_t(rounds_.rank())] = static_cast<char*>(buf);
  OpDesc desc = makeDesc(OpCode::kSymmetricExchange, ctx.seq, bytes, -1);
  desc.symmetric = 1;
  desc.symChunk = ref.chunk;
  desc.symOffset = ref.offset;
  rounds_.run(
      ctx, desc,
      [&] {
        syncHeaps(ctx);
        // Step 1/2: our descriptor and HeapTable are published; every peer's are readable once all have arrived.
        rounds_.syncRound(ctx);
        for (int p = 0; p < size; ++p) {
          if (p != rounds_.rank()) {
            peers.bases[size_t(p)] = peerBuffer(ctx, p, bytes);
          }
        }
        // Step 2/2: we read no descriptor any more; the next operation may reuse them.
        rounds_.syncRound(ctx);
      },
      [&] {
        // Some rank's buffer is not in its heap: that rank refused before the vote, so this runs only if a caller
        // bypassed that check. Fail the operation on every rank alike.
        rounds_.syncRound(ctx);
        throw core::Error(
            core::detail::str("symmetric rendezvous: some rank's buffer is not in its symmetric heap; allocate it "
                              "with torch.distributed._symmetric_memory.empty or tunedist.symmetric_empty"));
      });
  return peers;
}

}  // namespace tunedist::shm::zero_copy
