#include "shm/copy_in.h"

#include <algorithm>
#include <chrono>

#include "kernels/reduce.h"

namespace tunedist::shm {

SlotStoreChooser::Next SlotStoreChooser::next(size_t bytes) {
  if (bytes < kTimedMinBytes || ++copies_ <= kWarmCopies) {
    return Next::kCachedUntimed;
  }
  if (streaming_ && probeLeft_ == 0) {
    if (++sinceProbe_ < kProbeEvery) {
      return Next::kStreaming;
    }
    sinceProbe_ = 0;
    probeLeft_ = kProbeCopies;
    probeSum_ = 0;
    return Next::kCachedTimed;
  }
  if (probeLeft_ == 0 && averaged_ >= kMinSamples && ++sinceTimed_ < kTimeEvery) {
    return Next::kCachedUntimed;
  }
  sinceTimed_ = 0;
  return Next::kCachedTimed;
}

void SlotStoreChooser::record(double nsPerLine) {
  ++samples_;
  // Capped: one copy stretched by an interrupt moves the average by at most a quarter of the cap.
  const double sample = std::min(nsPerLine, kSampleCapNsPerLine);
  if (probeLeft_ > 0) {
    // A probe while streaming: its first copies take back lines that streaming left in the peers' caches (dearer
    // than the steady state: 37 against 2.5 ns per line once, inside real calls), so only the last kProbeCounted
    // count, and their mean alone decides.
    --probeLeft_;
    if (probeLeft_ < kProbeCounted) {
      probeSum_ += sample;
    }
    if (probeLeft_ == 0 && probeSum_ / kProbeCounted < kCachedBelowNsPerLine) {
      streaming_ = false;
      nsPerLine_ = probeSum_ / kProbeCounted;
      averaged_ = kMinSamples;
    }
    return;
  }
  nsPerLine_ = averaged_++ == 0 ? sample : 0.75 * nsPerLine_ + 0.25 * sample;
  if (averaged_ >= kMinSamples && nsPerLine_ > kStreamAboveNsPerLine) {
    streaming_ = true;
    sinceProbe_ = 0;
  }
}

void SlotCopyIn::copyStreamingUnlessForced(void* dst, const void* src, size_t bytes) {
  if (mode_ == core::SlotStores::kCached) {
    kernels::copyBytesCached(dst, src, bytes);
  } else {
    kernels::copyBytes(dst, src, bytes);
  }
}

SlotStoreChooser::Next SlotCopyIn::plan(size_t bytes) {
  switch (mode_) {
    case core::SlotStores::kCached: return SlotStoreChooser::Next::kCachedUntimed;
    case core::SlotStores::kStreaming: return SlotStoreChooser::Next::kStreaming;
    case core::SlotStores::kAuto:
    case core::SlotStores::kAutoPerCopy: break;
  }
  return chooser_.next(bytes);
}

void SlotCopyIn::copy(void* dst, const void* src, size_t bytes) {
  switch (plan(bytes)) {
    case SlotStoreChooser::Next::kCachedUntimed: kernels::copyBytesCached(dst, src, bytes); return;
    case SlotStoreChooser::Next::kStreaming: kernels::copyBytes(dst, src, bytes); return;
    case SlotStoreChooser::Next::kCachedTimed: timedCachedCopy(dst, src, bytes); return;
  }
}

void SlotCopyIn::timedCachedCopy(void* dst, const void* src, size_t bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  kernels::copyBytesCached(dst, src, bytes);
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0);
  chooser_.record(double(ns.count()) / double((bytes + 63) / 64));
}

bool SlotCopyIn::copyTwice(void* dst, void* own, const void* src, size_t bytes, bool streamOwn) {
  switch (plan(bytes)) {
    case SlotStoreChooser::Next::kCachedUntimed:
      kernels::copyBytesTwice(dst, own, src, bytes, false, streamOwn);
      return true;
    case SlotStoreChooser::Next::kStreaming:
      kernels::copyBytesTwice(dst, own, src, bytes, true, streamOwn);
      return true;
    case SlotStoreChooser::Next::kCachedTimed: timedCachedCopy(dst, src, bytes); return false;
  }
  return false;
}

}  // namespace tunedist::shm
