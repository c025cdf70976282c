// ZeroCopyCollectives::runVoted: the one place where the group decides whether an operation runs zero-copy. Included
// by the zero-copy collectives only.
#pragma once

#include <algorithm>
#include <chrono>

#include "shm/rounds.h"
#include "shm/zero_copy/zero_copy.h"

namespace tunedist::shm::zero_copy {

// Added to the time an operation on a path named by TUNEDIST_TEST_SLOW_PATHS reports: far above any real operation of
// the tests, so their choice does not depend on the host's noise.
constexpr std::chrono::seconds kTestSlowPathPenalty{1};

//   1. the collective's chooser plans the path of this size class (the same on every rank: decideDue, next);
//   2. copying path: the copying algorithm, our descriptor not symmetric; zero-copy path: our descriptor names our
//      buffer (the vote) and the first round compares every rank's (Rounds::checkDescs): when some rank's is not
//      symmetric, every rank starts again on the copying path;
//   3. a timed plan reports the operation's wall time per byte, unless the group restarted it.
template <typename ZeroCopyBody, typename CopyBody>
void ZeroCopyCollectives::runVoted(const core::OpContext& ctx, Op op, size_t bytes, OpDesc desc, HeapRef ref,
                                   ZeroCopyBody&& zeroCopyBody, CopyBody&& copyBody) {
  if (rounds_.size() == 1) {
    rounds_.run(ctx, desc, copyBody);
    return;
  }
  PathChooser& chooser = choosers_[op];
  const int cls = PathChooser::classOf(bytes);
  decideDue(op, cls);
  const PathChooser::Plan plan = chooser.next(bytes);
  if (plan.windowClosed) {
    shareVerdict(op, cls);  // released by this operation's first publish
  }
  restarted_ = false;
  // Between windows nothing is timed: the kept path costs what the copying collective or the zero-copy body costs.
  const auto start = plan.timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  if (plan.path == Path::kCopy) {
    rounds_.run(ctx, desc, copyBody);
  } else {
    // Our vote: the descriptor says where our buffer is.
    desc.symmetric = 1;
    desc.symChunk = ref.chunk;
    desc.symOffset = ref.offset;
    const bool streaming = plan.path == Path::kStreamingStores;
    rounds_.run(
        ctx, desc,
        [&] {
          syncHeaps(ctx);
          zeroCopyBody(streaming);
          heap_->countZeroCopy();
        },
        copyBody);
  }
  if (!plan.timed) {
    return;
  }
  if (restarted_) {
    chooser.dropPending();
    return;
  }
  auto took = std::chrono::steady_clock::now() - start;
  if (testSlowPaths_ & (1u << unsigned(plan.path))) {
    took += kTestSlowPathPenalty;
  }
  chooser.record(double(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count()) /
                 double(std::max<size_t>(bytes, 1)));
}

}  // namespace tunedist::shm::zero_copy
