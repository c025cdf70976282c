#include "shm/round_stores.h"

#include <algorithm>

namespace tunedist::shm {
namespace {

// Two modes, both probed in every window: blocks cached, streaming, streaming, cached.
constexpr uint32_t kBothModes = 0b11;

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
    decide(c, c.window.median(0), c.window.median(1));
  }
  const bool opening = !c.window.open();
  const Window::Step step = c.window.next(kBothModes);
  if (step.closed) {
    c.verdictDue = true;
    return {c.streaming, false, true};
  }
  if (step.mode < 0) {
    // Between windows: a large operation is timed for drift once this rank has a median of the kept mode.
    const int kept = c.streaming ? 1 : 0;
    const bool watch = bytes >= kDriftMinBytes && c.window.median(kept) > 0 && !c.probeWanted;
    if (watch) {
      pendingClass_ = cls;
      pendingMode_ = kept;
      pendingDrift_ = true;
    }
    return {c.streaming, watch, false};
  }
  if (opening) {
    c.probeWanted = false;
    c.driftCount = 0;
  }
  if (step.timed) {
    pendingClass_ = cls;
    pendingMode_ = step.mode;
    pendingDrift_ = false;
  }
  return {step.mode == 1, step.timed, false};
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
      c.probeWanted = Window::medianOf(c.drift, kDriftOps) > kDriftFactor * c.window.median(pendingMode_);
    }
    return;
  }
  c.window.record(pendingMode_, nsPerByte);
}

void RoundStoreChooser::startWindowNext(int cls) {
  // A window already open (or due to close) stays as it is.
  classes_[size_t(cls)].window.startNext();
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
