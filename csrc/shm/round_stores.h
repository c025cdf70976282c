// RoundStoreChooser: slot stores for every collective (all_reduce one-shot and two-shot, all_gather, reduce_scatter,
// broadcast, reduce, gather, scatter, all_to_all), of one round or of many, chosen from what the whole operation costs
// rather than from the writer's copy alone. The writer's copy alone is the wrong measure for operations of many
// rounds: on 2 ranks of a 2-vCPU AMD EPYC (AVX2), in the jobs where the vCPUs sat far apart, a chooser that timed
// only the copy into the slot kept them cached at 1.6-3x the streaming time at 1-64 MiB, while the writer's copy
// never looked slow enough to switch (docs/performance.md#store-placement-cached-or-streaming).
//
// What streaming stores also change is how the peers read those bytes: from memory instead of out of our cache. In a
// broadcast that alone decided (core::ShmOptions::broadcastStreamBelowBytes), and for the single-round operations the
// writer's copy was the wrong measure too: on 2 ranks of a 2-vCPU AMD EPYC (Zen 4), streaming took 0.72-0.93 of the
// time of a chooser that timed the writer's copy alone for a one-shot all_reduce of 32-128 KiB in one sitting,
// 0.80-0.86 for reduce_scatter of 64-256 KiB in another, while in a third cached stores were as fast or 1.5x faster
// (docs/performance.md#store-placement-cached-or-streaming).
//
// So each rank times its own work in the operation (its copies and its reduction: the time outside waitAll, which
// would add the peers' skew) per byte, in both modes. The probes are a fixed function of how many operations of the
// size class came before, identical on every rank (every rank runs the same operations in the same order: the
// descriptors check it), so in every probe all ranks write the same way and each rank's reads see the mode it is
// timing. When a window closes, each rank publishes its medians (RoundVerdict in its RankCtl), and at the next
// operation of the class every rank decides from the slowest rank's medians: the same inputs, so the same mode on every
// rank, the configuration the probes measured. (Were ranks to decide differently, they would still compute the same
// bits: how the bytes got into a slot changes nothing for the reader but its speed.)
//
// Schedule per size class (powers of two from kMinBytes; the last class takes everything larger; shm/probe_window.h,
// which PathChooser shares): kWarmOps cached operations (the slots' pages fault in), then a probe window of
// kProbeBlocks blocks of kBlockOps operations (cached, streaming, streaming, cached: a linear drift of the host hits
// both modes alike), the first kSettleOps of each block untimed (each of the two slot buffers meets the new mode once:
// the first cached write after a streaming one must take its lines back from the peer: shm/store_policy.h). The
// operation after the window closes it; the one after that decides: the mode whose slowest rank has the lower median
// cost per byte is kept (back to back, an operation starts no sooner than its busiest rank ends the previous one; a
// broadcast's root and readers do different work, and on 2 ranks of the Zen 4 EPYC at 64 KiB the root took 0.115 /
// 0.051 ns per byte cached / streaming and the reader 0.032 / 0.086: equal sums, while streaming ran the loop 1.35x
// faster), unless it is the other one by less than kSwitchMargin (no flapping on noise). Windows start at fixed
// operation counts: kFirstGap operations after the previous one, the gap doubling up to kMaxGap.
//
// Between windows the host can change under a job (its two processes moved nearer or further apart: seen within a
// 20-second job on a 2-vCPU AMD EPYC), and at up to 1024 operations apart a 64 MiB all_reduce would wait 10-20 s in the
// wrong mode at 1.7x the time. So each rank also times its operations of at least kDriftMinBytes between windows, and
// when the median of kDriftOps in a row costs more than kDriftFactor x its own last window median of the kept mode,
// it asks for a window (probeWanted). The ask travels in that rank's descriptor of its next operation of the class,
// which every rank reads at that operation's first wait (Rounds::checkDescs), so every rank starts the window at the
// same next operation of the class (startWindowNext): the schedule stays the same on every rank.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "shm/layout.h"
#include "shm/probe_window.h"

namespace tunedist::shm {

class RoundStoreChooser {
 public:
  static constexpr size_t kMinBytes = size_t(8) << 10;
  static constexpr int kClasses = kRoundSizeClasses;  // 8 KiB, 16 KiB, ..., 1 MiB and larger
  static constexpr uint32_t kWarmOps = 4;
  static constexpr uint32_t kBlockOps = 4;
  static constexpr uint32_t kSettleOps = 2;
  static constexpr uint32_t kProbeBlocks = 4;
  static constexpr uint32_t kWindowOps = kBlockOps * kProbeBlocks;
  static constexpr uint32_t kSamplesPerMode = (kBlockOps - kSettleOps) * kProbeBlocks / 2;
  static constexpr uint64_t kFirstGap = 64;
  static constexpr uint64_t kMaxGap = 1024;
  static constexpr double kSwitchMargin = 0.95;
  static constexpr size_t kDriftMinBytes = size_t(256) << 10;
  static constexpr uint32_t kDriftOps = 4;
  static constexpr double kDriftFactor = 1.5;

  // Classes whose smallest size is under `streamBelowBytes` start streaming, the others cached.
  explicit RoundStoreChooser(size_t streamBelowBytes = 0);

  struct Plan {
    bool streaming = false;
    // After a timed plan the caller reports the operation's work per byte to record() (a window's sample, or between
    // windows one that watches for drift).
    bool timed = false;
    // This operation closed a window: the caller shares lastCachedNsPerByte / lastStreamingNsPerByte of its class.
    bool windowClosed = false;
  };

  // How to write the slot in the next operation, whose rank writes `bytes` into its slot (operations under
  // kMinBytes are cached and untimed). A verdict still due in the class (see
  // decide()) is taken from this rank's medians alone.
  Plan next(size_t bytes);
  // Whether the class's last window closed at an earlier operation and waits for decide(): call it before next()
  // with the largest medians over the ranks that shared theirs. A 0 (nobody measured both) changes nothing.
  bool verdictDue(int cls) const { return classes_[size_t(cls)].verdictDue; }
  void decide(int cls, double cachedNsPerByte, double streamingNsPerByte);
  // The work of the operation that the last next() timed, in ns per byte. A missing report (the operation failed)
  // only leaves its window with a sample less.
  void record(double nsPerByte);

  // Whether this rank's operations of the class drifted since its last window (see above); cleared when a window
  // starts.
  bool probeWanted(int cls) const { return classes_[size_t(cls)].probeWanted; }
  // Asks for a window as a drift would (until the next window starts).
  void askForWindow(int cls) { classes_[size_t(cls)].probeWanted = true; }
  // A rank of the group wanted a window: the next operation of the class starts one, unless one is open. Every rank
  // calls it at the same operation.
  void startWindowNext(int cls);

  static int classOf(size_t bytes);
  bool streaming(int cls) const { return classes_[size_t(cls)].streaming; }
  // This rank's medians in the last closed window of `cls`, cached and streaming (0 before the first, or without
  // a sample of that mode).
  double lastCachedNsPerByte(int cls) const { return classes_[size_t(cls)].window.median(0); }
  double lastStreamingNsPerByte(int cls) const { return classes_[size_t(cls)].window.median(1); }
  uint32_t windows(int cls) const { return classes_[size_t(cls)].window.windows(); }

 private:
  using Window = ProbeWindow<2, kSamplesPerMode>;  // mode 0 cached, 1 streaming
  static constexpr ProbeSchedule kSchedule{kWarmOps, kBlockOps, kSettleOps, kFirstGap, kMaxGap};
  struct Class {
    Window window{kSchedule};
    bool streaming = false;
    bool verdictDue = false;
    // Between windows: the kept mode's last costs, and whether they asked for a window.
    std::array<double, kDriftOps> drift{};
    uint32_t driftCount = 0;
    bool probeWanted = false;
  };
  void decide(Class& c, double cachedNsPerByte, double streamingNsPerByte);

  std::array<Class, kClasses> classes_{};
  // The class and mode of the operation that the last next() timed; -1 when it timed none. pendingDrift_: timed
  // between windows.
  int pendingClass_ = -1;
  int pendingMode_ = 0;
  bool pendingDrift_ = false;
};

}  // namespace tunedist::shm
