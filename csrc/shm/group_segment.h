// GroupSegment: one group's shared-memory segment and what keeps it honest: attaching (rank 0 creates it, the others
// open it, every rank waits until all have mapped it), the heartbeat thread that holds this rank's life lock, the
// liveness checks made while waiting for peers, and the failure state.
//
// Failure model: waits end with an error on timeout, on a peer found dead (heartbeat plus process checks), or when
// another rank aborted the group. The first failure is written to the segment's abort word, so it reaches every
// rank, and the group stays failed: later calls fail fast with the original cause.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/op_context.h"
#include "core/options.h"
#include "core/rendezvous.h"
#include "shm/layout.h"
#include "shm/segment.h"

namespace tunedist::shm {

// What the zero-copy collectives (shm/zero_copy/) hear from the group: set once, before the first operation.
class GroupListener {
 public:
  virtual ~GroupListener() = default;
  // An operation starts again on the copying path because some rank's buffer was not symmetric.
  virtual void onCopyRestart() = 0;
  // The group failed (any thread): nobody maps this group's heap chunks again.
  virtual void onAbort() noexcept = 0;
};

class GroupSegment {
 public:
  GroupSegment(std::shared_ptr<core::Rendezvous> rendezvous, int rank, int size, const core::ShmOptions& options);
  // Stops the heartbeat thread (this rank leaves the group).
  ~GroupSegment();
  GroupSegment(const GroupSegment&) = delete;
  GroupSegment& operator=(const GroupSegment&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const core::ShmOptions& options() const { return options_; }
  size_t reservedBytes() const { return geometry_.totalBytes; }
  bool attached() const { return map_.header != nullptr; }
  // Creates or opens the segment at the group's first operation; a no-op afterwards.
  void attach(const core::OpContext& ctx);

  SegmentHeader& header() const { return *map_.header; }
  RankCtl& ctl(int rank) const { return map_.ctls[rank]; }
  char* slot(int rank, int buffer) const {
    return reinterpret_cast<char*>(map_.header) + geometry_.slotOffset(rank, buffer);
  }
  // Rank `rank`'s HeapTable in `header`'s segment.
  HeapTable& heapTable(const SegmentHeader* header, int rank) const {
    return reinterpret_cast<HeapTable*>(reinterpret_cast<char*>(const_cast<SegmentHeader*>(header)) +
                                        geometry_.heapOffset)[rank];
  }
  // The header once initialised, for any thread (abort() may run on a watchdog's); null before.
  SegmentHeader* sharedHeader() const { return map_.shared.load(std::memory_order_acquire); }
  void setListener(GroupListener* listener) { listener_ = listener; }
  GroupListener* listener() const { return listener_; }

  // While waiting for `waitingFor` to publish `step` (the operation's `stepInOp`-th): fails on a peer's abort, on
  // the deadline, or on a dead peer (checked every 10 ms).
  void checkPeers(const core::OpContext& ctx, uint64_t step, int stepInOp, const std::vector<int>& waitingFor);

  // Marks the group failed with `reason` (shared with all ranks, with its kind) and wakes every waiter. The first
  // failure wins; later calls only share it again. Idempotent; any thread.
  void abort(const std::string& reason, core::FailureKind kind = core::FailureKind::kError);
  // Throws the stored failure if the group has failed (locally or through a peer's abort).
  void throwIfFailed();
  bool failed() const { return failure_.failed.load(std::memory_order_acquire); }
  [[noreturn]] void fail(const core::OpContext& ctx, const std::string& message, bool isTimeout, bool isDead);
  // Fails this op with a peer's abort found in the segment, keeping the kind the peer gave it.
  [[noreturn]] void failFromPeerAbort(const core::OpContext& ctx);

 private:
  void createSegment(const core::OpContext& ctx);
  void openSegment(const core::OpContext& ctx);
  void waitAllAttached(const core::OpContext& ctx);
  // Fails if a peer left an abort reason in the rendezvous before the segment was ready.
  void checkAttachAbort(const core::OpContext& ctx);
  // Writes this process's identity (pid, pid namespace, start time) into our RankCtl, for the peers' liveness checks.
  void publishIdentity();
  void startHeartbeat();
  void heartbeatLoop();
  // Whether `rank` has published `step` (acquire: its writes for that step are visible once this is true).
  bool reached(int rank, uint64_t step) const { return ctl(rank).step.load(std::memory_order_acquire) >= step; }

  std::shared_ptr<core::Rendezvous> rendezvous_;
  const int rank_;
  const int size_;
  const core::ShmOptions options_;
  const SegmentGeometry geometry_;
  GroupListener* listener_ = nullptr;

  // The segment, and where its header and RankCtl array sit once this rank has attached.
  struct Mapping {
    ShmSegment segment;
    SegmentHeader* header = nullptr;
    RankCtl* ctls = nullptr;
    // The header for abort(), which may run on another thread (a watchdog): set once the header is initialised.
    std::atomic<SegmentHeader*> shared{nullptr};
  };
  // What this rank's waits have seen of the peers: each one's last heartbeat value and when it last moved.
  struct PeerWatch {
    std::vector<uint64_t> lastBeat;
    std::vector<std::chrono::steady_clock::time_point> lastBeatChange;
    std::chrono::steady_clock::time_point lastCheck;
  };
  // The group's first failure, local or a peer's; `failed` is read without the mutex.
  struct Failure {
    std::atomic<bool> failed{false};
    std::mutex mutex;
    std::string reason;
    core::FailureKind kind = core::FailureKind::kError;
  };
  // The thread that holds this rank's life lock and counts its heartbeat until stopped.
  struct Heartbeat {
    std::atomic<bool> stop{false};
    std::mutex mutex;
    std::condition_variable cv;
    std::thread thread;
  };
  Mapping map_;
  PeerWatch peers_;
  Failure failure_;
  Heartbeat heartbeat_;
};

}  // namespace tunedist::shm
