// ProbeWindow: the probe schedule of one size class, shared by the two choosers that measure alternatives on the
// group's own operations: RoundStoreChooser (shm/round_stores.h: cached or streaming slot stores) and PathChooser
// (shm/zero_copy/path_chooser.h: copying, or zero-copy with cached or streaming stores).
//
// A window is a run of blocks of blockOps operations, one block per mode in the window's set in ascending order,
// then one per mode in descending order (cached, streaming, streaming, cached; copy, cached, streaming, streaming,
// cached, copy: a linear drift of the host hits every mode alike). The first settleOps of each block are untimed (the
// first operation after a switch meets the other mode's cache state). The first window starts after warmOps
// operations; the operation after a window's last one closes it (each mode's median of its samples, 0 without one);
// the next window starts firstGap operations after the previous one closed, the gap doubling up to maxGap, or at the
// next operation when startNext() says so. Everything here is a function of the operation count, the modes the caller
// names when a window starts and the startNext() calls: never of the samples, so callers that feed every rank the
// same inputs get the same schedule on every rank.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

namespace tunedist::shm {

struct ProbeSchedule {
  uint32_t warmOps;
  uint32_t blockOps;
  uint32_t settleOps;
  uint64_t firstGap;
  uint64_t maxGap;
};

// kModes: how many modes a caller chooses between (a bit each in a mode set); kMaxSamples: samples kept per mode and
// window (extra ones are dropped).
template <int kModes, uint32_t kMaxSamples>
class ProbeWindow {
 public:
  static_assert(kModes > 0 && kModes <= 8, "a mode set is one byte");

  explicit ProbeWindow(const ProbeSchedule& s) : s_(s), windowStart_(s.warmOps), gap_(s.firstGap) {}

  struct Step {
    // The mode this operation probes; -1 between windows (the caller runs its kept mode).
    int mode = -1;
    // The caller reports this operation's cost to record().
    bool timed = false;
    // This operation closed a window: median() holds the window's figures.
    bool closed = false;
  };

  // The next operation. `modes` (a bit per mode, at least one) is the set a window starting at this operation probes;
  // it is read only then.
  Step next(uint32_t modes) {
    const uint64_t op = ops_++;
    if (open_ && op >= windowStart_ + windowOps()) {
      close();
      return {-1, false, true};
    }
    if (!open_) {
      if (op < windowStart_) {
        return {};
      }
      open(modes);
    }
    const uint64_t pos = op - windowStart_;
    return {blocks_[size_t(pos / s_.blockOps)], pos % s_.blockOps >= s_.settleOps, false};
  }

  // A cost of `mode` in the open window.
  void record(int mode, double cost) {
    uint32_t& n = count_[size_t(mode)];
    if (n < kMaxSamples) {
      samples_[size_t(mode)][n++] = cost;
    }
  }

  // The next operation starts a window, unless one is open (or its closing operation is still to come).
  void startNext() {
    if (!open_ && ops_ < windowStart_) {
      windowStart_ = ops_;
    }
  }

  bool open() const { return open_; }
  // Operations so far; windows closed so far.
  uint64_t ops() const { return ops_; }
  uint32_t windows() const { return windows_; }
  // The modes of the open window, or of the last closed one.
  uint32_t modes() const { return modes_; }
  // Mode m's median in the last closed window (0 before the first, or without a sample of m).
  double median(int mode) const { return medians_[size_t(mode)]; }

  // The median of the first n samples (0 < n <= N): the mean of the middle two when n is even.
  template <size_t N>
  static double medianOf(std::array<double, N> s, uint32_t n) {
    n = std::min(n, uint32_t(N));
    std::sort(s.begin(), s.begin() + n);
    return n % 2 == 1 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  }

 private:
  uint64_t windowOps() const { return uint64_t(blockCount_) * s_.blockOps; }

  void open(uint32_t modes) {
    open_ = true;
    modes_ = modes;
    blockCount_ = 0;
    for (int m = 0; m < kModes; ++m) {
      if (modes & (1u << m)) {
        blocks_[blockCount_++] = m;
      }
    }
    for (int m = kModes - 1; m >= 0; --m) {
      if (modes & (1u << m)) {
        blocks_[blockCount_++] = m;
      }
    }
  }

  void close() {
    open_ = false;
    windowStart_ += windowOps() + gap_;
    gap_ = std::min(2 * gap_, s_.maxGap);
    ++windows_;
    for (int m = 0; m < kModes; ++m) {
      medians_[size_t(m)] = count_[size_t(m)] > 0 ? medianOf(samples_[size_t(m)], count_[size_t(m)]) : 0.0;
    }
    count_ = {};
  }

  ProbeSchedule s_;
  uint64_t ops_ = 0;
  uint64_t windowStart_;
  uint64_t gap_;
  uint32_t windows_ = 0;
  bool open_ = false;
  uint32_t modes_ = 0;
  std::array<int, 2 * kModes> blocks_{};
  uint32_t blockCount_ = 0;
  std::array<std::array<double, kMaxSamples>, kModes> samples_{};
  std::array<uint32_t, kModes> count_{};
  std::array<double, kModes> medians_{};
};

}  // namespace tunedist::shm
