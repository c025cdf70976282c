#include "shm/zero_copy/path_chooser.h"

#include <algorithm>

namespace tunedist::shm::zero_copy {
namespace {

// The median of the first n samples (0 < n <= N): the mean of the middle two when n is even.
template <size_t N>
double median(std::array<double, N> s, uint32_t n) {
  n = std::min(n, uint32_t(N));
  std::sort(s.begin(), s.begin() + n);
  return n % 2 == 1 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

}  // namespace

const char* pathName(Path path) {
  switch (path) {
    case Path::kCopy: return "copy";
    case Path::kCachedStores: return "zero-copy cached";
    case Path::kStreamingStores: return "zero-copy streaming";
  }
  return "?";
}

PathChooser::PathChooser(uint32_t allowed, Path initial) : allowed_(allowed) {
  for (int p = 0; p < kPaths; ++p) {
    if (allowed & (1u << p)) {
      blocks_[blockCount_++] = Path(p);
    }
  }
  for (int p = kPaths - 1; p >= 0; --p) {
    if (allowed & (1u << p)) {
      blocks_[blockCount_++] = Path(p);
    }
  }
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
    decide(c, c.lastMedian);
  }
  // One allowed path: nothing to choose.
  if (blockCount_ <= 2) {
    return {c.path, false, false};
  }
  const uint64_t op = c.ops++;
  const uint64_t windowOps = uint64_t(blockCount_) * kBlockOps;
  if (op >= c.windowStart + windowOps) {
    closeWindow(c);
    return {c.path, false, true};
  }
  if (op < c.windowStart) {
    return {c.path, false, false};
  }
  const uint64_t pos = op - c.windowStart;
  const Path path = blocks_[pos / kBlockOps];
  const bool timed = pos % kBlockOps >= kSettleOps;
  if (timed) {
    pendingClass_ = cls;
    pendingPath_ = path;
  }
  return {path, timed, false};
}

void PathChooser::record(double nsPerByte) {
  if (pendingClass_ < 0) {
    return;
  }
  Class& c = classes_[size_t(pendingClass_)];
  pendingClass_ = -1;
  uint32_t& n = c.count[size_t(pendingPath_)];
  if (n < kMaxSamples) {
    c.samples[size_t(pendingPath_)][n++] = nsPerByte;
  }
}

void PathChooser::closeWindow(Class& c) {
  // The next window's start depends on operation counts alone, never on the samples: it is the same on every rank.
  c.windowStart += uint64_t(blockCount_) * kBlockOps + c.gap;
  c.gap = std::min(2 * c.gap, kMaxGap);
  ++c.windows;
  for (int p = 0; p < kPaths; ++p) {
    c.lastMedian[size_t(p)] = c.count[size_t(p)] > 0 ? median(c.samples[size_t(p)], c.count[size_t(p)]) : 0.0;
  }
  c.count = {};
  c.verdictDue = true;
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
