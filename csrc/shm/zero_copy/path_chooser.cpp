#include "shm/zero_copy/path_chooser.h"

#include <bit>

namespace tunedist::shm::zero_copy {

const char* pathName(Path path) {
  switch (path) {
    case Path::kCopy: return "copy";
    case Path::kCachedStores: return "zero-copy cached";
    case Path::kStreamingStores: return "zero-copy streaming";
  }
  return "?";
}

PathChooser::PathChooser(uint32_t allowed, Path initial) : allowed_(allowed), allowedCount_(std::popcount(allowed)) {
  for (auto& c : classes_) {
    c.path = initial;
  }
}

int PathChooser::classOf(size_t bytes) {
  int cls = 0;
  for (size_t b = kMinBytes * 2; b <= bytes && cls < kClasses - 1; b *= 2) {
    ++cls;
  }
  return cls;
}

PathChooser::Plan PathChooser::next(size_t bytes) {
  pendingClass_ = -1;
  const int cls = classOf(bytes);
  Class& c = classes_[size_t(cls)];
  if (c.verdictDue) {
    std::array<double, kPaths> mine{};
    for (int p = 0; p < kPaths; ++p) {
      mine[size_t(p)] = c.window.median(p);
    }
    decide(c, mine);
  }
  // One allowed path: nothing to choose.
  if (allowedCount_ <= 1) {
    return {c.path, false, false};
  }
  // Every window probes every allowed path.
  const Window::Step step = c.window.next(allowed_);
  if (step.closed) {
    c.verdictDue = true;
    return {c.path, false, true};
  }
  if (step.mode < 0) {
    return {c.path, false, false};
  }
  if (step.timed) {
    pendingClass_ = cls;
    pendingPath_ = Path(step.mode);
  }
  return {Path(step.mode), step.timed, false};
}

void PathChooser::record(double nsPerByte) {
  if (pendingClass_ < 0) {
    return;
  }
  Class& c = classes_[size_t(pendingClass_)];
  pendingClass_ = -1;
  c.window.record(int(pendingPath_), nsPerByte);
}

void PathChooser::decide(int cls, const std::array<double, kPaths>& nsPerByte) {
  decide(classes_[size_t(cls)], nsPerByte);
}

void PathChooser::decide(Class& c, const std::array<double, kPaths>& nsPerByte) {
  c.verdictDue = false;
  // Every allowed path needs a figure: a rank that missed one shares nothing, and then nothing changes.
  int best = -1;
  for (int p = 0; p < kPaths; ++p) {
    if (!(allowed_ & (1u << p))) {
      continue;
    }
    if (!(nsPerByte[size_t(p)] > 0)) {
      return;
    }
    if (best < 0 || nsPerByte[size_t(p)] < nsPerByte[size_t(best)]) {
      best = p;
    }
  }
  const double kept = nsPerByte[size_t(c.path)];
  if (best >= 0 && Path(best) != c.path && nsPerByte[size_t(best)] < kSwitchMargin * kept) {
    c.path = Path(best);
  }
}

}  // namespace tunedist::shm::zero_copy
