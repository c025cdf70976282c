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
// the hand-off (a 2-vCPU AMD EPYC, Zen 4; p50 us per 16 KiB / 64 KiB / 256 KiB one-shot;
// docs/performance.md#store-placement-cached-or-streaming):
//   host in its fast phase: cached 2.6 / 10.0 / 24.3, streaming 3.2 / 10.8 / 46.0 (copy-in 7-9 ns per line);
//   host in its slow phase: cached 11.0 / 43.5 / 156, streaming 3.1 / 9.5 / 32.9 (copy-in 27-36 ns per line).
// Inside real calls (torchrun, 2 ranks, 16 KiB) the fast phase's cached copy-in took 2.5-6.5 ns per line.
//
// So with kAuto (SlotStoreChooser) copy-ins of at least kTimedMinBytes are timed while copies are cached (after the
// first kWarmCopies, which fault the slot's pages in): each one until the average holds kMinSamples, then one in
// kTimeEvery. When the per-line cost (a moving average) goes above kStreamAboveNsPerLine, copies stream, and after
// every kProbeEvery streamed copies the next kProbeCopies are timed cached ones: if the last kProbeCounted of them
// average below kCachedBelowNsPerLine, copies are cached again. A rank decides for its own slot alone: how the bytes
// got there changes nothing for the reader but its speed.
//
// Why not time every cached copy: a timed copy must be the slot's copy alone, so all_gather cannot fuse it with its own
// output block (copyTwice), and at 16 MiB, where copies stay cached, that kept every round unfused: 0.84 of the time
// with every round fused, 0.97 apart (a 2-vCPU AMD EPYC, AVX2). One in kTimeEvery still sees a slowdown within
// a few dozen copies (three samples carry the average from 5 to 19 ns per line).
//
// Under kAuto every collective of 8 KiB or more now chooses instead from the whole operation's cost
// (shm/round_stores.h): this chooser serves TUNEDIST_SLOT_STORES=per-copy, kept to compare the two in one job.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/options.h"

namespace tunedist::shm {

// The kAuto policy alone (no copying, no clock), so tests can drive it with chosen costs.
class SlotStoreChooser {
 public:
  static constexpr size_t kTimedMinBytes = size_t(8) << 10;
  static constexpr double kStreamAboveNsPerLine = 16.0;
  static constexpr double kCachedBelowNsPerLine = 11.0;
  static constexpr double kSampleCapNsPerLine = 2 * kStreamAboveNsPerLine;
  static constexpr uint64_t kWarmCopies = 4;
  static constexpr uint32_t kMinSamples = 4;
  static constexpr uint32_t kProbeEvery = 64;
  static constexpr uint32_t kProbeCopies = 4;
  static constexpr uint32_t kProbeCounted = 2;
  // Once the average holds kMinSamples, one cached copy in kTimeEvery is timed (probes while streaming: all).
  static constexpr uint32_t kTimeEvery = 8;

  enum class Next { kCachedUntimed, kCachedTimed, kStreaming };

  // How to make the next copy of `bytes`. After kCachedTimed, the caller reports the copy's cost to record().
  Next next(size_t bytes);
  void record(double nsPerLine);

  bool streaming() const { return streaming_; }
  // The moving average of the cost per line, and how many timed copies were recorded in all.
  double nsPerLine() const { return nsPerLine_; }
  uint32_t samples() const { return samples_; }

 private:
  bool streaming_ = false;
  uint64_t copies_ = 0;
  uint32_t samples_ = 0;
  // Samples in nsPerLine_ (a probe that switches back to cached counts as kMinSamples).
  uint32_t averaged_ = 0;
  double nsPerLine_ = 0;
  uint32_t sinceProbe_ = 0;
  // Untimed cached copies since the last timed one (kTimeEvery).
  uint32_t sinceTimed_ = 0;
  uint32_t probeLeft_ = 0;
  double probeSum_ = 0;
};

class SlotCopyIn {
 public:
  explicit SlotCopyIn(core::SlotStores mode) : mode_(mode) {}

  // Copies `bytes` from `src` into our slot at `dst`; streaming copies end with an sfence, so the caller's release
  // store (publish) orders them.
  void copy(void* dst, const void* src, size_t bytes);
  // copy() into our slot at `dst` plus a copy into `own` (all_gather's own output block; streaming stores when
  // `streamOwn`), in one pass (copyBytesTwice) where the slot's stores are known without timing them: forced,
  // streaming, or an untimed cached copy; returns true then. A copy the chooser times (kCachedTimed) copies the slot
  // alone, so the time per line it records is the slot's, and returns false: the caller copies `own` after
  // publishing, as without this call. No range may overlap another.
  bool copyTwice(void* dst, void* own, const void* src, size_t bytes, bool streamOwn);
  // The same copy with streaming stores under kAuto, neither timed nor counted by the chooser: for a slot that only
  // the peers read, where the caller knows streaming is the faster (core::ShmOptions::broadcastStreamBelowBytes).
  // kCached and kStreaming stay forced.
  void copyStreamingUnlessForced(void* dst, const void* src, size_t bytes);

  // Whether copies of at least SlotStoreChooser::kTimedMinBytes currently stream.
  bool streaming() const {
    return mode_ == core::SlotStores::kStreaming ||
           ((mode_ == core::SlotStores::kAuto || mode_ == core::SlotStores::kAutoPerCopy) && chooser_.streaming());
  }
  const SlotStoreChooser& chooser() const { return chooser_; }

 private:
  // How the next copy of `bytes` into the slot goes: the chooser's plan under the auto modes, the forced stores
  // otherwise (kCached as kCachedUntimed).
  SlotStoreChooser::Next plan(size_t bytes);
  // A cached copy timed for the chooser (kCachedTimed).
  void timedCachedCopy(void* dst, const void* src, size_t bytes);

  const core::SlotStores mode_;
  SlotStoreChooser chooser_;
};

}  // namespace tunedist::shm
