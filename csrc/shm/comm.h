// ShmComm: the collectives of one process group among the ranks of one host, over one shared-memory segment.
//
// Protocol in one paragraph: every rank owns a monotonic step counter in shared memory. An operation is a series
// of rounds; in a round a rank writes into its own slot, publishes the next step (release), waits until every
// peer has published that step (acquire), and then reads the peers' slots. All ranks run the same sequence of
// rounds, so step numbers agree across ranks. Slots are double-buffered: before rewriting buffer b a rank waits
// until every peer has published the step that follows its last read of b, which is usually long past, so a
// round costs one synchronisation. The first round of every operation also carries an OpDesc that all ranks
// compare, so ranks that disagree (op, size, dtype, root) fail together with a clear error.
//
// Failure model: waits end with an error on timeout, on a peer found dead (heartbeat plus process checks), or when
// another rank aborted the group. The first failure is written to the segment's abort word, so it reaches every
// rank, and the communicator stays failed: later calls fail fast with the original cause.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/options.h"
#include "core/rendezvous.h"
#include "core/types.h"
#include "kernels/reduce.h"
#include "shm/copy_in.h"
#include "shm/heap.h"
#include "shm/layout.h"
#include "shm/round_stores.h"
#include "shm/segment.h"

namespace tunedist::shm {

enum class OpCode : uint32_t {
  kAllreduce = 1,
  kBroadcast,
  kReduce,
  kAllgather,
  kGather,
  kScatter,
  kReduceScatter,
  kAlltoall,
  kBarrier,
};
const char* opCodeName(OpCode op);

OpDesc makeDesc(OpCode op, uint64_t seq, uint64_t count, int root, DType dtype = DType::kUInt8,
                RedOp redop = RedOp::kSum, double factor = 0.0);

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

// Per-call context: what the op is called in messages, its sequence number and its deadline.
struct OpContext {
  const char* name;
  uint64_t seq;
  std::chrono::steady_clock::time_point deadline;
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

class ShmComm {
 public:
  // `heap` (may be null) is this rank's symmetric heap: the zero-copy collectives below run on buffers in it.
  ShmComm(std::shared_ptr<Rendezvous> rendezvous, int rank, int size, ShmOptions options,
          std::shared_ptr<SymmetricHeap> heap = nullptr);
  ~ShmComm();
  ShmComm(const ShmComm&) = delete;
  ShmComm& operator=(const ShmComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const ShmOptions& options() const { return options_; }
  // Bytes this group reserves in /dev/shm at its first collective.
  size_t reservedBytes() const;
  bool attached() const { return header_ != nullptr; }

  // Collectives on raw host memory. Counts are elements of args.dtype, sizes are bytes. Each blocks until done.
  void allreduce(const OpContext& ctx, const void* in, void* out, size_t count, const ReduceArgs& args);
  void broadcast(const OpContext& ctx, void* buf, size_t bytes, int root);
  // `out` is written on the root only (may be null elsewhere).
  void reduce(const OpContext& ctx, const void* in, void* out, size_t count, const ReduceArgs& args, int root);
  // outs[p] receives rank p's `bytes`; outs[rank] may equal `in`.
  void allgather(const OpContext& ctx, const void* in, size_t bytes, void* const* outs);
  // outs (size() pointers) is used on the root only.
  void gather(const OpContext& ctx, const void* in, size_t bytes, void* const* outs, int root);
  // ins (size() pointers) is used on the root only.
  void scatter(const OpContext& ctx, const void* const* ins, void* out, size_t bytes, int root);
  // ins[p] (count elements each) is the block reduced into rank p's `out`; `out` may equal ins[rank].
  void reduceScatter(const OpContext& ctx, const void* const* ins, void* out, size_t count, const ReduceArgs& args);
  // Sends sendBytes[p] from sends[p] to rank p and receives recvBytes[p] into recvs[p]; every rank checks that
  // every pair's sizes agree.
  void alltoallv(const OpContext& ctx, const void* const* sends, const size_t* sendBytes, void* const* recvs,
                 const size_t* recvBytes);
  void barrier(const OpContext& ctx);

  // Zero-copy collectives (shm/symmetric/) on buffers in this rank's symmetric heap, `ref` saying where: ranks read
  // and write each other's buffers directly instead of staging through slots. The first round agrees: if some
  // rank's buffer is not symmetric (it called the copying method, or passed a buffer outside its heap), every
  // rank runs the copying algorithm instead, with the same results. Results are bit-identical to the copying
  // algorithms (each element is reduced over ranks 0..P-1 in order by one rank).
  // In place on `buf` (count elements).
  void allreduceSymmetric(const OpContext& ctx, void* buf, HeapRef ref, size_t count, const ReduceArgs& args);
  // `out` holds size() blocks of `bytes`; block rank() receives `in` (which may be that block itself).
  void allgatherSymmetric(const OpContext& ctx, const void* in, size_t bytes, void* out, HeapRef outRef);
  // `in` holds size() blocks of `count` elements; block p is reduced into rank p's `out`, which may be our own block
  // of `in` but must not overlap another.
  void reduceScatterSymmetric(const OpContext& ctx, const void* in, HeapRef inRef, void* out, size_t count,
                              const ReduceArgs& args);
  void broadcastSymmetric(const OpContext& ctx, void* buf, HeapRef ref, size_t bytes, int root);
  const std::shared_ptr<SymmetricHeap>& heap() const { return heap_; }

  // The collectives, each with a RoundStoreChooser of its own that picks its slot stores from the whole operation's
  // cost (shm/round_stores.h), of one round or of many; all_reduce one-shot and two-shot apart (different work per
  // byte).
  enum RoundFamily {
    kOneShotAllreduce,
    kAllgather,
    kReduceScatter,
    kBroadcast,
    kTwoShotAllreduce,
    kReduce,
    kGather,
    kScatter,
    kAlltoall
  };
  const RoundStoreChooser& roundStoreChooser(RoundFamily family) const { return roundChoosers_[family]; }
  // Only from the thread that runs this rank's operations, between them.
  RoundStoreChooser& roundStoreChooser(RoundFamily family) { return roundChoosers_[family]; }
  // The copy into our slot under TUNEDIST_SLOT_STORES=per-copy, and of every copy under RoundStoreChooser::kMinBytes
  // (its SlotStoreChooser).
  const SlotCopyIn& slotCopyIn() const { return slotCopy_; }

  // Marks the group failed with `reason` (shared with all ranks, with its kind) and wakes every waiter. The first
  // failure wins; later calls only share it again. Idempotent.
  void abort(const std::string& reason, FailureKind kind = FailureKind::kError);
  // Throws the stored failure if the group has failed (locally or through a peer's abort).
  void throwIfFailed();
  bool failed() const { return failed_.load(std::memory_order_acquire); }

 private:
  // Attaching (comm.cpp).
  void ensureAttached(const OpContext& ctx);
  void createSegment(const OpContext& ctx);
  void openSegment(const OpContext& ctx);
  void waitAllAttached(const OpContext& ctx);
  // Fails if a peer left an abort reason in the rendezvous before the segment was ready.
  void checkAttachAbort(const OpContext& ctx);
  void startHeartbeat();
  void heartbeatLoop();

  // The round protocol (round.cpp).
  uint64_t publish(const OpContext& ctx);
  void waitAll(const OpContext& ctx, uint64_t step) {
    if (!timingWaits_) {
      waitUntilAll(ctx, step);
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    waitUntilAll(ctx, step);
    waited_ += std::chrono::steady_clock::now() - t0;
  }
  void waitUntilAll(const OpContext& ctx, uint64_t step);
  void acquireBuffer(const OpContext& ctx, int buffer);
  void releaseBuffer(int buffer);
  // Starts a round: takes the current buffer (waiting until peers are done with its previous contents) and
  // flips to the other one for the next round. Returns the buffer index to use.
  int beginRound(const OpContext& ctx);
  void writeDesc(int buffer, const OpDesc& desc);
  void checkDescs(const OpContext& ctx, int buffer);
  void checkPeers(const OpContext& ctx, uint64_t step, const std::vector<int>& waitingFor);
  [[noreturn]] void fail(const OpContext& ctx, const std::string& message, bool isTimeout, bool isDead);
  // Fails this op with a peer's abort found in the segment, keeping the kind the peer gave it.
  [[noreturn]] void failFromPeerAbort(const OpContext& ctx);
  // Runs one operation: attaches at the first, takes the first round's buffer and writes the descriptor
  // (startOp), then `body`; any failure is shared with the whole group before it propagates. A template, so the
  // body is called directly: no std::function (and no allocation) per operation. When the first round finds some
  // ranks' descriptors symmetric and some not (checkDescs throws RestartOnCopyPath on every rank), every rank
  // starts the operation again with its symmetric mark cleared and runs `copyBody`, the copying algorithm.
  template <typename Body, typename CopyBody>
  void runOp(const OpContext& ctx, const OpDesc& desc, Body&& body, CopyBody&& copyBody);
  template <typename Body>
  void runOp(const OpContext& ctx, const OpDesc& desc, Body&& body) {
    runOp(ctx, desc, body, body);
  }
  void startOp(const OpContext& ctx, const OpDesc& desc);
  // Runs a zero-copy operation (shm/symmetric/): `desc` marked symmetric at `ref`, our heap's new chunks listed,
  // then `zeroCopyBody`. With one rank, or when some rank's buffer is not symmetric, `copyBody` instead.
  template <typename ZeroCopyBody, typename CopyBody>
  void runSymmetric(const OpContext& ctx, OpDesc desc, HeapRef ref, ZeroCopyBody&& zeroCopyBody, CopyBody&& copyBody);
  // Thrown by checkDescs (not an error): ranks disagree only on running the zero-copy algorithm.
  struct RestartOnCopyPath {};

  // The copying algorithms, inside runOp.
  void allreduceCopy(const OpContext& ctx, const void* in, void* out, size_t count, const ReduceArgs& args);
  void gatherBody(const OpContext& ctx, const void* in, size_t bytes, void* const* outs, int root);
  void broadcastBody(const OpContext& ctx, void* buf, size_t bytes, int root);
  void reduceScatterBody(const OpContext& ctx, const void* const* ins, void* out, size_t count, const ReduceArgs& args);

  // The symmetric heap as the group sees it (symmetric/peers.cpp).
  // Writes our chunks that are not yet in our HeapTable into it, and maps the chunks peers have published since
  // the last call (so their names are unlinked early).
  void syncHeaps(const OpContext& ctx);
  // Rank p's buffer of this operation (its descriptor's symChunk/symOffset), `bytes` long, mapped here.
  char* peerBuffer(const OpContext& ctx, int p, size_t bytes);
  char* mapPeerChunk(const OpContext& ctx, int p, uint32_t chunk);
  // Removes the names of every chunk this rank knows of (its own and its peers'): the group has ended or failed,
  // nobody will map them again. With `orphansToo`, also every unheld chunk name whose creator has exited
  // (ShmSegment::sweepDeadOwners): a peer that died before anybody mapped its chunks, which no table may list yet.
  // Any thread. Never throws.
  void dropHeapNames(bool orphansToo) noexcept;
  HeapTable& heapTable(int rank) const { return heapTableIn(header_, rank); }
  HeapTable& heapTableIn(SegmentHeader* header, int rank) const {
    return reinterpret_cast<HeapTable*>(reinterpret_cast<char*>(header) + geometry_.heapOffset)[rank];
  }
  // One round with no data: publish; wait for all (the caller's comment says what the step hands over).
  void syncRound(const OpContext& ctx);

  // Algorithms (one file per collective).
  // gather to `root`, or to every rank (all_gather) when root is -1; callers have validated root.
  void gatherTo(const OpContext& ctx, const void* in, size_t bytes, void* const* outs, int root);
  void allreduceOneShot(const OpContext& ctx, const void* in, void* out, size_t count, const ReduceArgs& args);
  void allreduceTwoShot(const OpContext& ctx, const void* in, void* out, size_t count, const ReduceArgs& args);
  // Our own block goes straight from input to output; memmove because callers may pass overlapping views. With
  // `stream` (the caller's ranges do not overlap) the block is written with streaming stores (copyBytes).
  static void copyOwn(void* dst, const void* src, size_t bytes, bool stream = false) {
    if (dst == src || bytes == 0) {
      return;
    }
    if (stream) {
      copyBytes(dst, src, bytes);
    } else {
      std::memmove(dst, src, bytes);
    }
  }
  // Copies into our own slot, which peers read next: cached or streaming stores (shm/copy_in.h), or those a
  // RoundStores in scope chose.
  void copyIntoSlot(void* dst, const void* src, size_t n) {
    if (roundStreaming_ < 0) {
      slotCopy_.copy(dst, src, n);
    } else if (roundStreaming_ > 0) {
      copyBytes(dst, src, n);
    } else {
      copyBytesCached(dst, src, n);
    }
  }
  // copyIntoSlot(dst, src, n) plus our own output block `own` (an all_gather's; streaming stores when `streamOwn`), in
  // one pass over src where the slot's stores allow (SlotCopyIn::copyTwice; a RoundStores in scope fixes them).
  // Returns whether `own` was copied (not when the per-copy chooser times the slot's copy: the caller copies it after
  // publishing). No overlaps.
  bool copyIntoSlotAndOwn(void* dst, void* own, const void* src, size_t n, bool streamOwn) {
    if (roundStreaming_ < 0) {
      return slotCopy_.copyTwice(dst, own, src, n, streamOwn);
    }
    copyBytesTwice(dst, own, src, n, roundStreaming_ > 0, streamOwn);
    return true;
  }
  // For the length of one operation under SlotStores::kAuto with peers (`active`) and `bytes` (what its size class is
  // counted in) of at least RoundStoreChooser::kMinBytes: its copies into our slot, in every round, use the stores
  // that `family`'s chooser plans, and when the chooser times the operation, done() reports its work: the time since
  // construction outside waitAll, per byte. An operation that throws reports nothing.
  class RoundStores {
   public:
    RoundStores(ShmComm& comm, RoundFamily family, size_t bytes, bool active);
    ~RoundStores() {
      comm_.roundStreaming_ = -1;
      comm_.timingWaits_ = false;
    }
    RoundStores(const RoundStores&) = delete;
    RoundStores& operator=(const RoundStores&) = delete;
    // After the operation's last read of a peer's slot.
    void done();
    // Whether the chooser picks this operation's stores (copyIntoSlot uses them).
    bool active() const { return comm_.roundStreaming_ >= 0; }

   private:
    ShmComm& comm_;
    // The family's chooser and the operation's class while the chooser picks the stores; chooser_ while it times.
    RoundStoreChooser* family_ = nullptr;
    int cls_ = 0;
    RoundStoreChooser* chooser_ = nullptr;
    size_t bytes_ = 0;
    std::chrono::steady_clock::time_point start_;
  };
  // Copies `n` bytes out of a peer's slot into the caller's memory; `received` is what the operation delivers, which
  // chooses cached stores up to `cachedMaxBytes` (ShmOptions::cachedCopyMaxBytes unless the op has its own) and
  // streaming ones above.
  void copyOut(void* dst, const void* src, size_t n, size_t received) const {
    copyOut(dst, src, n, received, options_.cachedCopyMaxBytes);
  }
  void copyOut(void* dst, const void* src, size_t n, size_t received, size_t cachedMaxBytes) const {
    if (received <= cachedMaxBytes) {
      copyBytesCached(dst, src, n);
    } else {
      copyBytes(dst, src, n);
    }
  }
  // Bytes of each of the size_ parts a slot is cut into (scatter, all_to_all, reduce_scatter, the two-shot
  // all-reduce's slices), rounded down to whole cache lines so parts never share one.
  size_t slotPartBytes() const { return (options_.slotBytes / size_t(size_)) / kCacheLine * kCacheLine; }
  // Elements per slice so that size_ slices of `count`-element chunks fit one slot, 64-byte aligned.
  size_t sliceElems(size_t count, size_t elemSize) const;

  char* slot(int rank, int buffer) const {
    return reinterpret_cast<char*>(header_) + geometry_.slotOffset(rank, buffer);
  }
  RankCtl& ctl(int rank) const { return ctls_[rank]; }
  // Whether `rank` has published `step` (acquire: its writes for that step are visible once this is true).
  bool reached(int rank, uint64_t step) const { return ctl(rank).step.load(std::memory_order_acquire) >= step; }

  std::shared_ptr<Rendezvous> rendezvous_;
  const int rank_;
  const int size_;
  const ShmOptions options_;
  const SegmentGeometry geometry_;
  const StallPoint stall_;
  SlotCopyIn slotCopy_{options_.slotStores};
  // A broadcast's classes under broadcastStreamBelowBytes start streaming (ShmOptions).
  RoundStoreChooser roundChoosers_[kRoundFamilies] = {
      RoundStoreChooser(), RoundStoreChooser(),
      RoundStoreChooser(), RoundStoreChooser(options_.broadcastStreamBelowBytes),
      RoundStoreChooser(), RoundStoreChooser(),
      RoundStoreChooser(), RoundStoreChooser(),
      RoundStoreChooser()};
  static_assert(kAlltoall + 1 == kRoundFamilies, "one RoundVerdict per family in RankCtl");
  // While a RoundStores is in scope: its stores (0 cached, 1 streaming; -1: slotCopy_ decides), and while it times
  // the operation, the time spent in waitAll.
  int roundStreaming_ = -1;
  bool timingWaits_ = false;
  std::chrono::nanoseconds waited_{0};

  ShmSegment segment_;
  SegmentHeader* header_ = nullptr;
  RankCtl* ctls_ = nullptr;
  // header_ for abort(), which may run on another thread (a watchdog): set once the header is initialised.
  std::atomic<SegmentHeader*> abortHeader_{nullptr};

  // Protocol state, identical on every rank while the group is healthy.
  uint64_t step_ = 0;
  int stepInOp_ = 0;
  uint64_t opSeq_ = 0;
  int buffer_ = 0;
  uint64_t releaseStep_[kNumBuffers] = {0, 0};
  // The first wait of an operation compares descriptors (written to descBuffer_).
  bool descPending_ = false;
  int descBuffer_ = 0;
  // Whether a rank's descriptor of this operation asked for a probe window (read by checkDescs; RoundStores::done).
  bool groupProbeRequest_ = false;

  // Liveness bookkeeping: last heartbeat value seen per peer and when it last moved.
  std::vector<uint64_t> lastBeat_;
  std::vector<std::chrono::steady_clock::time_point> lastBeatChange_;
  std::chrono::steady_clock::time_point lastPeerCheck_;

  std::atomic<bool> failed_{false};
  std::mutex failMutex_;
  std::string failure_;
  FailureKind failureKind_ = FailureKind::kError;

  // The zero-copy engine: our heap, how many of its chunks our HeapTable lists, peers' chunks mapped here.
  std::shared_ptr<SymmetricHeap> heap_;
  uint32_t heapPublished_ = 0;
  std::vector<std::vector<ShmSegment>> peerChunks_;

  std::atomic<bool> stopHeartbeat_{false};
  std::mutex heartbeatMutex_;
  std::condition_variable heartbeatCv_;
  std::thread heartbeat_;
};

template <typename Body, typename CopyBody>
void ShmComm::runOp(const OpContext& ctx, const OpDesc& desc, Body&& body, CopyBody&& copyBody) {
  throwIfFailed();
  try {
    try {
      startOp(ctx, desc);
      body();
    } catch (const RestartOnCopyPath&) {
      // Every rank got here after the same first round (no slot was read): start again, all on the copying path.
      if (heap_ != nullptr) {
        heap_->countCopyRestart();
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
    abort(e.what(), failureKindOf(e));
    throw;
  }
}

template <typename ZeroCopyBody, typename CopyBody>
void ShmComm::runSymmetric(const OpContext& ctx, OpDesc desc, HeapRef ref, ZeroCopyBody&& zeroCopyBody,
                           CopyBody&& copyBody) {
  if (size_ == 1) {
    runOp(ctx, desc, copyBody);
    return;
  }
  desc.symmetric = 1;
  desc.symChunk = ref.chunk;
  desc.symOffset = ref.offset;
  runOp(
      ctx, desc,
      [&] {
        syncHeaps(ctx);
        zeroCopyBody();
        heap_->countZeroCopy();
      },
      copyBody);
}

}  // namespace tunedist::shm
