// Rounds: the round protocol of one process group among the ranks of one host, the narrow face the copying
// algorithms (one file per collective in shm/) and the zero-copy collectives (shm/zero_copy/) run on.
//
// Protocol in one paragraph: every rank owns a monotonic step counter in shared memory. An operation is a series
// of rounds; in a round a rank writes into its own slot, publishes the next step (release), waits until every
// peer has published that step (acquire), and then reads the peers' slots. All ranks run the same sequence of
// rounds, so step numbers agree across ranks. Slots are double-buffered: before rewriting buffer b a rank waits
// until every peer has published the step that follows its last read of b, which is usually long past, so a
// round costs one synchronisation. The first round of every operation also carries an OpDesc that all ranks
// compare, so ranks that disagree (op, size, dtype, root) fail together with a clear error, and ranks that agree
// on the operation but not on running it zero-copy all run it on the copying path (the group vote, run()).
//
// Rounds owns the group's segment (GroupSegment: attach, heartbeat, failure) and its store policy (StorePolicy:
// cached or streaming stores into our slot); an algorithm sees rounds, slots, a stores Scope and failure.
#pragma once

#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/op_context.h"
#include "core/options.h"
#include "core/rendezvous.h"
#include "kernels/reduce.h"
#include "shm/descriptor.h"
#include "shm/group_segment.h"
#include "shm/layout.h"
#include "shm/store_policy.h"

namespace tunedist::shm {

// One source pointer per rank, on the stack for groups of up to kInline ranks: no allocation per operation.
class RankPtrs {
 public:
  explicit RankPtrs(int n) {
    if (n > kInline) {
      heap_.resize(size_t(n));
    }
  }
  const void*& operator[](int p) { return heap_.empty() ? inline_[p] : heap_[size_t(p)]; }
  const void* const* data() const { return heap_.empty() ? inline_ : heap_.data(); }

 private:
  static constexpr int kInline = 16;
  const void* inline_[kInline] = {};
  std::vector<const void*> heap_;
};

// Test hook: stall `rank` for `stallMs` when it reaches `step` (1-based count of publishes within an operation)
// of operation `seq`, so a fault test can kill it mid-protocol. Set through TUNEDIST_TEST_STALL=rank:seq:step:ms.
struct StallPoint {
  int rank = -1;
  uint64_t seq = 0;
  int step = 0;
  int stallMs = 0;
  static StallPoint fromEnv();
};

// Our own block goes straight from input to output; memmove because callers may pass overlapping views. With
// `stream` (the caller's ranges do not overlap) the block is written with streaming stores (copyBytes).
inline void copyOwn(void* dst, const void* src, size_t bytes, bool stream = false) {
  if (dst == src || bytes == 0) {
    return;
  }
  if (stream) {
    kernels::copyBytes(dst, src, bytes);
  } else {
    std::memmove(dst, src, bytes);
  }
}

// Copies `n` bytes out of a peer's slot (or buffer) into the caller's memory; `received` is what the operation
// delivers, which chooses cached stores up to `cachedMaxBytes` (core::ShmOptions::cachedCopyMaxBytes unless the op has
// its own) and streaming ones above.
inline void copyOut(void* dst, const void* src, size_t n, size_t received, size_t cachedMaxBytes) {
  if (received <= cachedMaxBytes) {
    kernels::copyBytesCached(dst, src, n);
  } else {
    kernels::copyBytes(dst, src, n);
  }
}

class Rounds {
 public:
  Rounds(std::shared_ptr<core::Rendezvous> rendezvous, int rank, int size, const core::ShmOptions& options);
  Rounds(const Rounds&) = delete;
  Rounds& operator=(const Rounds&) = delete;

  int rank() const { return segment_.rank(); }
  int size() const { return segment_.size(); }
  const core::ShmOptions& options() const { return segment_.options(); }
  GroupSegment& segment() { return segment_; }
  StorePolicy& storePolicy() { return policy_; }

  // Runs one operation: attaches at the first, takes the first round's buffer and writes the descriptor, then
  // `body`; any failure is shared with the whole group before it propagates. A template, so the body is called
  // directly: no std::function (and no allocation) per operation. When the first round finds some ranks'
  // descriptors symmetric and some not (the vote), every rank starts the operation again with its symmetric mark
  // cleared and runs `copyBody`, the copying algorithm.
  template <typename Body, typename CopyBody>
  void run(const core::OpContext& ctx, const OpDesc& desc, Body&& body, CopyBody&& copyBody);
  template <typename Body>
  void run(const core::OpContext& ctx, const OpDesc& desc, Body&& body) {
    run(ctx, desc, body, body);
  }

  // Starts a round: takes the current buffer (waiting until peers are done with its previous contents) and
  // flips to the other one for the next round. Returns the buffer index to use.
  int beginRound(const core::OpContext& ctx);
  // Publishes our next step (release: our slot writes of this round are visible to whoever sees it).
  uint64_t publish(const core::OpContext& ctx);
  // Waits until every rank has published `step` (acquire); the operation's first wait compares the descriptors.
  void waitAll(const core::OpContext& ctx, uint64_t step) {
    if (!policy_.timingWaits()) {
      waitUntilAll(ctx, step);
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    waitUntilAll(ctx, step);
    policy_.addWaited(std::chrono::steady_clock::now() - t0);
  }
  // After the round's last read of a peer's slot in `buffer`.
  void releaseBuffer(int buffer) {
    // Each rank reads a round's slots before it publishes again, so step_ + 1 marks everybody done with `buffer`.
    releaseStep_[buffer] = step_ + 1;
  }
  // One round with no data: publish; wait for all (the caller's comment says what the step hands over).
  void syncRound(const core::OpContext& ctx);

  char* slot(int rank, int buffer) const { return segment_.slot(rank, buffer); }
  // Bytes of each of the size() parts a slot is cut into (scatter, all_to_all, reduce_scatter, the two-shot
  // all-reduce's slices), rounded down to whole cache lines so parts never share one.
  size_t slotPartBytes() const { return (options().slotBytes / size_t(size())) / kCacheLine * kCacheLine; }
  // Elements per slice so that size() slices of `count`-element chunks fit one slot, 64-byte aligned.
  size_t sliceElems(size_t count, size_t elemSize) const;
  // The stores of this operation's copies into our slot: `family`'s chooser, for `bytes` (its size class).
  StorePolicy::Scope stores(StorePolicy::Family family, size_t bytes) {
    return StorePolicy::Scope(policy_, family, bytes,
                              StorePolicy::Site{&segment_.ctl(0), rank(), size(),
                                                stepInOp_ == 0 ? &segment_.ctl(rank()).desc[descBuffer_] : nullptr,
                                                &groupProbeRequest_});
  }
  // Rank p's descriptor of the operation in progress (after the first wait).
  const OpDesc& opDesc(int p) const { return segment_.ctl(p).desc[descBuffer_]; }

 private:
  // Thrown by checkDescs (not an error): ranks disagree only on running the zero-copy algorithm.
  struct RestartOnCopyPath {};

  void startOp(const core::OpContext& ctx, const OpDesc& desc);
  void waitUntilAll(const core::OpContext& ctx, uint64_t step);
  void acquireBuffer(const core::OpContext& ctx, int buffer);
  void checkDescs(const core::OpContext& ctx, int buffer);

  GroupSegment segment_;
  StorePolicy policy_;
  const StallPoint stall_;

  // Protocol state, identical on every rank while the group is healthy.
  uint64_t step_ = 0;
  int stepInOp_ = 0;
  uint64_t opSeq_ = 0;
  int buffer_ = 0;
  uint64_t releaseStep_[kNumBuffers] = {0, 0};
  // The first wait of an operation compares descriptors (written to descBuffer_).
  bool descPending_ = false;
  int descBuffer_ = 0;
  // Whether a rank's descriptor of this operation asked for a probe window (read by checkDescs; Scope::done).
  bool groupProbeRequest_ = false;
};

template <typename Body, typename CopyBody>
void Rounds::run(const core::OpContext& ctx, const OpDesc& desc, Body&& body, CopyBody&& copyBody) {
  segment_.throwIfFailed();
  try {
    try {
      startOp(ctx, desc);
      body();
    } catch (const RestartOnCopyPath&) {
      // Every rank got here after the same first round (no slot was read): start again, all on the copying path.
      if (segment_.listener() != nullptr) {
        segment_.listener()->onCopyRestart();
      }
      OpDesc plain = desc;
      plain.symmetric = 0;
      plain.symChunk = 0;
      plain.symOffset = 0;
      startOp(ctx, plain);
      copyBody();
    }
    TD_ASSERT(!descPending_, "operation ", ctx.name, " ended without a round");
  } catch (const std::exception& e) {
    // Whatever failed, peers must not wait for us: share the first failure with the whole group.
    segment_.abort(e.what(), core::failureKindOf(e));
    throw;
  }
}

}  // namespace tunedist::shm
