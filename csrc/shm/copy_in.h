// SlotCopyIn: how a rank copies data into its own slot, where its peers read it next.
//
// A cached copy (memcpy) leaves the lines in our cache, where a peer on a nearby core fetches them fastest. But every
// line of a slot was read by a peer one or two operations ago, so before our stores can land they must take the
// line back from the peer's cache. Where the cores are far apart in the coherence fabric (on a cloud VM the two vCPUs
// of a 2-core guest can sit on different core complexes, and the host can move them), that read-for-ownership costs
// 25-35 ns per 64-byte line, and the copy-in of a 16 KiB one-shot all-reduce takes 9 us instead of 0.4. Streaming
// (non-temporal) stores skip it: they write to memory and invalidate the peer's copy without waiting for it, and the
// peer reads the data from memory (~2 us per 16 KiB). Where the cores are close, streaming is the slower of the two
// (the peer's read from memory costs more than the ownership transfer saves). Measured with a two-process model of
// the hand-off (docs/records/issue14/s18/handoff.cpp, Zen 4 VM, p50 us per 16 KiB / 64 KiB / 256 KiB one-shot):
//   host in its fast phase: cached 2.6 / 10.0 / 24.3, streaming 3.2 / 10.8 / 46.0 (copy-in 7 ns per line);
//   host in its slow phase: cached 11.0 / 43.5 / 156, streaming 3.1 / 9.5 / 32.9 (copy-in 27-36 ns per line).
// So with kAuto each copy-in of at least kTimedMinBytes is timed while copies are cached; when the per-line cost
// (a moving average, after kWarmSamples copies) goes above kStreamAboveNsPerLine, copies stream, and every
// kProbeEvery-th copy is a timed cached one again, which switches back below kCachedBelowNsPerLine. A rank decides for
// its own slot alone: how the bytes got there changes nothing for the reader but its speed.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/options.h"

namespace tunedist::shm {

class SlotCopyIn {
 public:
  static constexpr size_t kTimedMinBytes = size_t(8) << 10;
  static constexpr double kStreamAboveNsPerLine = 16.0;
  static constexpr double kCachedBelowNsPerLine = 11.0;
  static constexpr uint32_t kProbeEvery = 64;
  static constexpr uint32_t kWarmSamples = 4;
  static constexpr double kSampleCapNsPerLine = 2 * kStreamAboveNsPerLine;

  explicit SlotCopyIn(SlotStores mode) : mode_(mode) {}

  // Copies `bytes` from `src` into our slot at `dst`; streaming copies end with an sfence, so the caller's release
  // store (publish) orders them.
  void copy(void* dst, const void* src, size_t bytes);

  // Takes one timed cached copy's cost into the moving average and chooses the stores of the next copies (copy()
  // calls it; tests feed it directly).
  void record(double nsPerLine);
  // Whether copies of at least kTimedMinBytes currently stream, and the moving average of the timed copies.
  bool streaming() const { return mode_ == SlotStores::kStreaming || (mode_ == SlotStores::kAuto && streaming_); }
  double nsPerLine() const { return nsPerLine_; }
  // Timed copies (and record() calls) so far.
  uint32_t samples() const { return samples_; }

 private:
  const SlotStores mode_;
  bool streaming_ = false;
  uint32_t sinceProbe_ = 0;
  double nsPerLine_ = 0;
  uint32_t samples_ = 0;
};

}  // namespace tunedist::shm
