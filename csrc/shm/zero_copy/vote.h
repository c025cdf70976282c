// ZeroCopyCollectives::runVoted: the one place where the group decides whether an operation runs zero-copy. Included
// by the zero-copy collectives only.
#pragma once

#include "shm/rounds.h"
#include "shm/zero_copy/zero_copy.h"

namespace tunedist::shm::zero_copy {

template <typename ZeroCopyBody, typename CopyBody>
void ZeroCopyCollectives::runVoted(const core::OpContext& ctx, OpDesc desc, HeapRef ref, ZeroCopyBody&& zeroCopyBody,
                                   CopyBody&& copyBody) {
  if (rounds_.size() == 1) {
    rounds_.run(ctx, desc, copyBody);
    return;
  }
  // Our vote: the descriptor says where our buffer is. The first round compares every rank's (Rounds::checkDescs):
  // when some rank's is not symmetric, every rank starts again on the copying path.
  desc.symmetric = 1;
  desc.symChunk = ref.chunk;
  desc.symOffset = ref.offset;
  rounds_.run(
      ctx, desc,
      [&] {
        syncHeaps(ctx);
        zeroCopyBody();
        heap_->countZeroCopy();
      },
      copyBody);
}

}  // namespace tunedist::shm::zero_copy
