// PathChooser: whether a collective on symmetric buffers runs zero-copy or copies through the slots, and with which
// stores its zero-copy writes go, per operation and size class, from what this host measures. One threshold set on one
// machine was wrong on another: on 2 ranks of a 2-vCPU AMD EPYC (Zen 4) the zero-copy all_gather took 1.25-1.56x the
// copying time at 1-4 MiB and all_reduce up to 1.43x, where a 2-vCPU Intel Xeon had it at 0.45-0.75x
// (docs/performance.md#symmetric-buffers). The reason is a property of the host: pushing into a peer's buffer with
// streaming stores sends every byte to memory (8-10 GB/s per core there), while the copying path's bytes stay in the
// shared L3; cached pushes ran at 19-27 GB/s.
//
// So, as RoundStoreChooser (shm/round_stores.h) does for slot stores: each rank times its operations of a class in
// every allowed path (the whole operation, waits included: the paths differ in their synchronisations too) per byte,
// in a probe window whose schedule is a fixed function of how many operations of the class came before, identical on
// every rank, so in every probe all ranks run the same path. When a window closes each rank publishes its medians
// (PathVerdict in its RankCtl); at the next operation of the class every rank decides from the slowest rank's
// medians: the same inputs, so the same path everywhere. The group vote (ZeroCopyCollectives::runVoted) still guards
// each operation: ranks that disagree on running zero-copy all copy.
//
// Schedule per size class (powers of two from kMinBytes; the last class takes everything larger; shm/probe_window.h,
// which RoundStoreChooser shares): kWarmOps operations in the class's current path, then a window of one block of
// kBlockOps per allowed path in ascending order and one in descending order (copy, cached, streaming, streaming,
// cached, copy: a linear drift of the host hits all alike), the first kSettleOps of each block untimed (the first
// operation after a switch meets the other path's cache state). The operation after the window closes it; the next
// one decides: the path with the lowest slowest-rank median is kept, unless the kept one is within kSwitchMargin of
// it. Windows start kFirstGap operations after the previous one, the gap doubling up to kMaxGap.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "shm/layout.h"
#include "shm/probe_window.h"

namespace tunedist::shm::zero_copy {

// How one collective on symmetric buffers runs.
enum class Path : uint8_t {
  kCopy = 0,            // the copying algorithm through the slots
  kCachedStores = 1,    // zero-copy, writing peers' buffers (or our output) with plain stores
  kStreamingStores = 2  // zero-copy, with streaming stores (no read-for-ownership, bytes go to memory)
};
constexpr int kPaths = kZeroCopyPaths;
const char* pathName(Path path);

class PathChooser {
 public:
  static constexpr size_t kMinBytes = size_t(64) << 10;
  static constexpr int kClasses = kPathSizeClasses;  // 64 KiB, 128 KiB, ..., 64 MiB and larger
  static constexpr uint32_t kWarmOps = 2;
  static constexpr uint32_t kBlockOps = 3;
  static constexpr uint32_t kSettleOps = 1;
  static constexpr uint32_t kMaxSamples = 2 * (kBlockOps - kSettleOps);
  static constexpr uint64_t kFirstGap = 64;
  static constexpr uint64_t kMaxGap = 1024;
  static constexpr double kSwitchMargin = 0.95;

  // `allowed`: a bit per Path this operation may take; `initial`: every class's path before its first verdict.
  PathChooser(uint32_t allowed, Path initial);

  struct Plan {
    Path path = Path::kCopy;
    // The caller times the operation and reports its ns per byte to record().
    bool timed = false;
    // This operation closed a window: the caller shares lastMedian() of its class before the operation publishes.
    bool windowClosed = false;
  };
  // The path of the next operation of `bytes` (at least kMinBytes) and advances the class's count. A verdict still due
  // (see decide()) is taken from this rank's medians alone.
  Plan next(size_t bytes);
  // The operation the last next() timed, in ns per byte; nothing when it was not timed or ran another path.
  void record(double nsPerByte);
  // The last next() planned an operation that did not run its plan (the group restarted it on the copying path):
  // its sample, if any, is dropped.
  void dropPending() { pendingClass_ = -1; }

  // Whether the class's last window closed and waits for decide(): call it before next() with, per path, the
  // largest median over the ranks that shared theirs (0: nobody measured that path).
  bool verdictDue(int cls) const { return classes_[size_t(cls)].verdictDue; }
  void decide(int cls, const std::array<double, kPaths>& nsPerByte);

  static int classOf(size_t bytes);
  static size_t classMinBytes(int cls) { return kMinBytes << cls; }
  Path path(int cls) const { return classes_[size_t(cls)].path; }
  uint32_t allowed() const { return allowed_; }
  double lastMedian(int cls, Path path) const { return classes_[size_t(cls)].window.median(int(path)); }
  uint32_t windows(int cls) const { return classes_[size_t(cls)].window.windows(); }

 private:
  using Window = ProbeWindow<kPaths, kMaxSamples>;
  static constexpr ProbeSchedule kSchedule{kWarmOps, kBlockOps, kSettleOps, kFirstGap, kMaxGap};
  struct Class {
    Window window{kSchedule};
    Path path = Path::kCopy;
    bool verdictDue = false;
  };
  void decide(Class& c, const std::array<double, kPaths>& nsPerByte);

  const uint32_t allowed_;
  const int allowedCount_;
  std::array<Class, kClasses> classes_{};
  int pendingClass_ = -1;
  Path pendingPath_ = Path::kCopy;
};

}  // namespace tunedist::shm::zero_copy
