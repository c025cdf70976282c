// ZeroCopyCollectives: the collectives on buffers in this rank's symmetric heap (shm/heap.h), where ranks read and
// write each other's buffers directly instead of staging through slots. It owns the heap's publication to the group
// (our chunks listed in our HeapTable, peers' chunks mapped on demand, every chunk's name removed as soon as nobody
// needs it) and runs its four collectives on the group's round protocol (shm/rounds.h).
//
// Whether an operation runs zero-copy is decided in three steps: locally, accepts() (the buffer lies in our heap and
// the operation reaches ShmOptions::zeroCopyMinBytes); then the collective's PathChooser (path_chooser.h) picks the
// path for the operation's size class from what this group measured (copying, or zero-copy with cached or streaming
// stores; with TUNEDIST_SYMMETRIC_MIN_BYTES set, zero-copy always, with the stores measured), the same on every
// rank; then the group votes at the operation's first round (runVoted): when some rank's buffer is not symmetric or
// its plan is not zero-copy, every rank runs the copying algorithm instead, with the same results. Results are
// bit-identical to the copying algorithms (each element is reduced over ranks 0..P-1 in order by one rank).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/op_context.h"
#include "kernels/reduce.h"
#include "shm/group_segment.h"
#include "shm/heap.h"
#include "shm/layout.h"
#include "shm/segment.h"
#include "shm/zero_copy/path_chooser.h"

namespace tunedist::shm {
class Rounds;
}  // namespace tunedist::shm

namespace tunedist::shm::zero_copy {

// Every rank's buffer of one symmetric allocation, mapped in this process (torch's symm_mem.rendezvous, c10d
// windows): bases[p] is rank p's, valid while the group's communicator lives. `segment` is the group's, for waits
// on signals in those buffers (liveness, abort).
struct SymmetricPeers {
  std::vector<char*> bases;
  GroupSegment* segment = nullptr;
};

class ZeroCopyCollectives final : public GroupListener {
 public:
  // `heap` is this rank's symmetric heap; `rounds` outlives this object.
  ZeroCopyCollectives(Rounds& rounds, std::shared_ptr<SymmetricHeap> heap);
  // Removes the names of the chunks this rank knows of (orphans too after a failure).
  ~ZeroCopyCollectives() override;
  ZeroCopyCollectives(const ZeroCopyCollectives&) = delete;
  ZeroCopyCollectives& operator=(const ZeroCopyCollectives&) = delete;

  // The local half of the vote: whether [ptr, ptr + bytes) lies in our heap (*ref: where), in a group of more than one
  // rank, and `bytes` reaches `minBytes`.
  bool accepts(const void* ptr, size_t bytes, size_t minBytes, HeapRef* ref) const;

  // The collectives a PathChooser serves, in PathVerdict order (layout.h).
  enum Op { kAllreduce, kAllgather, kReduceScatter, kBroadcast };
  static constexpr Op kOps[kZeroCopyOps] = {kAllreduce, kAllgather, kReduceScatter, kBroadcast};
  static const char* opName(Op op);

  // In place on `buf` (count elements).
  void allreduce(const core::OpContext& ctx, void* buf, HeapRef ref, size_t count, const kernels::ReduceArgs& args);
  // `out` holds size() blocks of `bytes`; block rank() receives `in` (which may be that block itself).
  void allgather(const core::OpContext& ctx, const void* in, size_t bytes, void* out, HeapRef outRef);
  // `in` holds size() blocks of `count` elements; block p is reduced into rank p's `out`, which may be our own block
  // of `in` but must not overlap another.
  void reduceScatter(const core::OpContext& ctx, const void* in, HeapRef inRef, void* out, size_t count,
                     const kernels::ReduceArgs& args);
  void broadcast(const core::OpContext& ctx, void* buf, HeapRef ref, size_t bytes, int root);
  // Collective: every rank's `bytes`-long buffer in its heap (ours at `buf`, `ref`), mapped here (exchange.cpp).
  // Ranks whose sizes differ fail the group, naming them.
  SymmetricPeers exchange(const core::OpContext& ctx, void* buf, HeapRef ref, size_t bytes);

  // An operation of `op` moving `bytes` that runs on the copying path here because this rank's buffer does not qualify
  // (accepts() said no, or not consecutive): its chooser counts it as every rank counts it, so the probe schedules stay
  // the same on every rank whoever passes a plain buffer.
  void pass(Op op, size_t bytes);

  const std::shared_ptr<SymmetricHeap>& heap() const { return heap_; }
  // Only from the thread that runs this rank's operations, or between them.
  const PathChooser& chooser(Op op) const { return choosers_[op]; }
  // Whether TUNEDIST_SYMMETRIC_MIN_BYTES forces the zero-copy path (the choosers then pick only the stores).
  bool forced() const { return forced_; }

  void onCopyRestart() override {
    restarted_ = true;
    heap_->countCopyRestart();
  }
  void onAbort() noexcept override { dropHeapNames(true); }

 private:
  // Runs one operation of `op` moving `bytes` (its size class) on the path its chooser plans, with the group vote
  // (shm/zero_copy/vote.h): on a zero-copy path `desc` marked symmetric at `ref`, our heap's new chunks listed, then
  // `zeroCopyBody(streaming)`; on the copying path, with one rank, or when some rank's descriptor is not symmetric,
  // `copyBody`. Times the operation when the chooser asks.
  template <typename ZeroCopyBody, typename CopyBody>
  void runVoted(const core::OpContext& ctx, Op op, size_t bytes, OpDesc desc, HeapRef ref, ZeroCopyBody&& zeroCopyBody,
                CopyBody&& copyBody);
  // Before the class's next plan: a verdict due is decided from the slowest rank's medians of the window every rank
  // closed (PathVerdict in each RankCtl); after a plan that closed a window, ours is published there.
  void decideDue(Op op, int cls);
  void shareVerdict(Op op, int cls);
  // Writes our chunks that are not yet in our HeapTable into it, and maps the chunks peers have published since the
  // last call (so their names are unlinked early).
  void syncHeaps(const core::OpContext& ctx);
  // Rank p's buffer of this operation (its descriptor's symChunk/symOffset), `bytes` long, mapped here.
  char* peerBuffer(const core::OpContext& ctx, int p, size_t bytes);
  char* mapPeerChunk(const core::OpContext& ctx, int p, uint32_t chunk);
  // Removes the names of every chunk this rank knows of (its own and its peers'): the group has ended or failed,
  // nobody will map them again. With `orphansToo`, also every unheld chunk name whose creator has exited
  // (ShmSegment::sweepDeadOwners): a peer that died before anybody mapped its chunks, which no table may list yet.
  // Any thread. Never throws.
  void dropHeapNames(bool orphansToo) noexcept;

  Rounds& rounds_;
  GroupSegment& segment_;
  std::shared_ptr<SymmetricHeap> heap_;
  // How many of our heap's chunks our HeapTable lists; peers' chunks mapped here.
  uint32_t heapPublished_ = 0;
  std::vector<std::vector<ShmSegment>> peerChunks_;
  const bool forced_;
  PathChooser choosers_[kZeroCopyOps];
  // Set by onCopyRestart: the operation in progress did not run its plan.
  bool restarted_ = false;
  // Test hook (TUNEDIST_TEST_SLOW_PATHS=copy,cached,streaming): a bit per Path whose timed operations report
  // kTestSlowPathPenalty more (vote.h), so tests know which path the choosers must keep.
  uint32_t testSlowPaths_ = 0;
};

}  // namespace tunedist::shm::zero_copy
