#include "shm/copy_in.h"

#include <algorithm>
#include <chrono>

#include "kernels/reduce.h"

namespace tunedist::shm {

void SlotCopyIn::copy(void* dst, const void* src, size_t bytes) {
  switch (mode_) {
    case SlotStores::kCached: copyBytesCached(dst, src, bytes); return;
    case SlotStores::kStreaming: copyBytes(dst, src, bytes); return;
    case SlotStores::kAuto: break;
  }
  if (bytes < kTimedMinBytes) {
    copyBytesCached(dst, src, bytes);
  } else if (streaming_ && ++sinceProbe_ < kProbeEvery) {
    copyBytes(dst, src, bytes);
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    copyBytesCached(dst, src, bytes);
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0);
    record(double(ns.count()) / double((bytes + 63) / 64));
  }
}

void SlotCopyIn::record(double nsPerLine) {
  // A quarter weight for the newest sample, capped: one copy stretched by an interrupt or a first touch of the slot's
  // pages does not flip the choice, and the first kWarmSamples only fill the average.
  const double sample = std::min(nsPerLine, kSampleCapNsPerLine);
  nsPerLine_ = samples_ == 0 ? sample : 0.75 * nsPerLine_ + 0.25 * sample;
  sinceProbe_ = 0;
  if (++samples_ < kWarmSamples) {
    return;
  }
  if (!streaming_ && nsPerLine_ > kStreamAboveNsPerLine) {
    streaming_ = true;
  } else if (streaming_ && nsPerLine_ < kCachedBelowNsPerLine) {
    streaming_ = false;
  }
}

}  // namespace tunedist::shm
