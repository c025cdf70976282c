#include "shm/round_stores.h"

#include <algorithm>

namespace tunedist::shm {
namespace {

// Probe block b's mode: cached, streaming, streaming, cached.
constexpr bool kBlockStreams[RoundStoreChooser::kProbeBlocks] = {false, true, true, false};

// The median of the first n samples (0 < n <= N): the mean of the middle two when n is even.
template <size_t N>
double median(std::array<double, N> s, uint32_t n) {
  n = std::min(n, uint32_t(N));
  std::sort(s.begin(), s.begin() + n);
  return n % 2 == 1 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

}  // namespace

RoundStoreChooser::RoundStoreChooser(size_t streamBelowBytes) {
  for (int cls = 0; cls < kClasses; ++cls) {
    classes_[size_t(cls)].streaming = (kMinBytes << cls) < streamBelowBytes;
  }
}

int RoundStoreChooser::classOf(size_t bytes) {
  int cls = 0;
  for (size_t b = kMinBytes * 2; b <= bytes && cls < kClasses - 1; b *= 2) {
    ++cls;
  }
  return cls;
}

RoundStoreChooser::Plan RoundStoreChooser::next(size_t bytes) {
  pendingClass_ = -1;
  if (bytes < kMinBytes) {
    return {};
  }
  const int cls = classOf(bytes);
  Class& c = classes_[size_t(cls)];
  if (c.verdictDue) {
    decide(c, c.lastMedian[0], c.lastMedian[1]);
  }
  const uint64_t op = c.ops++;
  if (op >= c.windowStart + kWindowOps) {
    closeWindow(c);
    return {c.streaming, false, true};
  }
  if (op < c.windowStart) {
    // Between windows: a large operation is timed for drift once this rank has a median of the kept mode.
    const bool watch = bytes >= kDriftMinBytes && c.lastMedian[c.streaming ? 1 : 0] > 0 && !c.probeWanted;
    if (watch) {
      pendingClass_ = cls;
      pendingMode_ = c.streaming ? 1 : 0;
      pendingDrift_ = true;
    }
    return {c.streaming, watch, false};
  }
  if (op == c.windowStart) {
    c.probeWanted = false;
    c.driftCount = 0;
  }
  const uint64_t pos = op - c.windowStart;
  const bool streaming = kBlockStreams[pos / kBlockOps];
  const bool timed = pos % kBlockOps >= kSettleOps;
  if (timed) {
    pendingClass_ = cls;
    pendingMode_ = streaming ? 1 : 0;
    pendingDrift_ = false;
  }
  return {streaming, timed, false};
}

void RoundStoreChooser::record(double nsPerByte) {
  if (pendingClass_ < 0) {
    return;
  }
  Class& c = classes_[size_t(pendingClass_)];
  pendingClass_ = -1;
  if (pendingDrift_) {
    c.drift[c.driftCount++] = nsPerByte;
    if (c.driftCount == kDriftOps) {
      c.driftCount = 0;
      c.probeWanted = median(c.drift, kDriftOps) > kDriftFactor * c.lastMedian[size_t(pendingMode_)];
    }
    return;
  }
  uint32_t& n = c.count[size_t(pendingMode_)];
  if (n < kSamplesPerMode) {
    c.samples[size_t(pendingMode_)][n++] = nsPerByte;
  }
}

void RoundStoreChooser::startWindowNext(int cls) {
  Class& c = classes_[size_t(cls)];
  // c.ops is the index of the class's next operation; a window already open (or due) stays as it is.
  if (c.ops < c.windowStart) {
    c.windowStart = c.ops;
  }
}

void RoundStoreChooser::closeWindow(Class& c) {
  // The next window's start depends on operation counts alone, never on the samples: it is the same on every rank.
  c.windowStart += kWindowOps + c.gap;
  c.gap = std::min(2 * c.gap, kMaxGap);
  ++c.windows;
  c.lastMedian = {c.count[0] > 0 ? median(c.samples[0], c.count[0]) : 0.0,
                  c.count[1] > 0 ? median(c.samples[1], c.count[1]) : 0.0};
  c.count = {0, 0};
  c.verdictDue = true;
}

void RoundStoreChooser::decide(int cls, double cachedNsPerByte, double streamingNsPerByte) {
  decide(classes_[size_t(cls)], cachedNsPerByte, streamingNsPerByte);
}

void RoundStoreChooser::decide(Class& c, double cachedNsPerByte, double streamingNsPerByte) {
  c.verdictDue = false;
  if (!(cachedNsPerByte > 0) || !(streamingNsPerByte > 0)) {
    return;
  }
  const double kept = c.streaming ? streamingNsPerByte : cachedNsPerByte;
  const double other = c.streaming ? cachedNsPerByte : streamingNsPerByte;
  if (other < kSwitchMargin * kept) {
    c.streaming = !c.streaming;
  }
}

}  // namespace tunedist::shm
