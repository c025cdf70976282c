// PathChooser, the zero-copy-or-copy choice of collectives on symmetric buffers, driven with chosen costs: its probe
// schedule is the same whatever the costs (every rank probes the same path in the same operation), a window closes one
// operation after its last probe and is decided at the next, the fastest path by the slowest rank's medians is kept
// unless the kept one is within the margin, a window without a figure for some path changes nothing, a forced
// override probes only the zero-copy paths, one allowed path is never timed, size classes are apart.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <vector>

#include "shm/zero_copy/path_chooser.h"

namespace tunedist::test {
namespace {

using shm::zero_copy::Path;
using shm::zero_copy::PathChooser;
using Plan = PathChooser::Plan;
constexpr size_t k64K = size_t(64) << 10;
constexpr size_t k1M = size_t(1) << 20;
constexpr uint32_t kAll = 0b111;
constexpr uint32_t kZeroCopyOnly = 0b110;
constexpr uint64_t kWindowOps3 = 6 * PathChooser::kBlockOps;  // three paths: copy, cached, streaming, and back

// Runs `ops` operations of `bytes`, recording cost(path) after each timed one; returns the plans.
template <typename Cost>
std::vector<Plan> drive(PathChooser& c, size_t bytes, uint64_t ops, Cost cost) {
  std::vector<Plan> plans;
  for (uint64_t i = 0; i < ops; ++i) {
    const Plan p = c.next(bytes);
    plans.push_back(p);
    if (p.timed) {
      c.record(cost(p.path));
    }
  }
  return plans;
}

// Cost per byte of each path, as a table.
auto costs(double copy, double cached, double streaming) {
  return [=](Path p) { return p == Path::kCopy ? copy : p == Path::kCachedStores ? cached : streaming; };
}

std::array<double, 3> medians(const PathChooser& c, int cls) {
  return {c.lastMedian(cls, Path::kCopy), c.lastMedian(cls, Path::kCachedStores),
          c.lastMedian(cls, Path::kStreamingStores)};
}

}  // namespace

TEST_CASE("paths: size classes are powers of two from 64 KiB, the last one open-ended", "[path_chooser]") {
  CHECK(PathChooser::classOf(k64K) == 0);
  CHECK(PathChooser::classOf(2 * k64K - 1) == 0);
  CHECK(PathChooser::classOf(2 * k64K) == 1);
  CHECK(PathChooser::classOf(k1M) == 4);
  CHECK(PathChooser::classOf(64 * k1M - 1) == 9);
  CHECK(PathChooser::classOf(64 * k1M) == 10);
  CHECK(PathChooser::classOf(size_t(1) << 34) == PathChooser::kClasses - 1);
  CHECK(PathChooser::classMinBytes(4) == k1M);
}

TEST_CASE("paths: the probe schedule is a function of the operation count alone", "[path_chooser]") {
  PathChooser fast(kAll, Path::kCopy);
  PathChooser slow(kAll, Path::kCopy);
  const auto a = drive(fast, k1M, 200, costs(1.0, 0.5, 2.0));
  const auto b = drive(slow, k1M, 200, costs(0.3, 9.0, 9.0));
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("operation " << i);
    CHECK(a[i].timed == b[i].timed);
    CHECK(a[i].windowClosed == b[i].windowClosed);
    if (i < PathChooser::kWarmOps + kWindowOps3) {
      CHECK(a[i].path == b[i].path);  // probes run the same path whatever the costs
    }
  }
  // Warm-up in the initial path, then blocks copy, cached, streaming, streaming, cached, copy; the first operation of
  // each block untimed.
  const Path order[] = {Path::kCopy,         Path::kCachedStores, Path::kStreamingStores, Path::kStreamingStores,
                        Path::kCachedStores, Path::kCopy};
  for (uint64_t i = 0; i < PathChooser::kWarmOps; ++i) {
    CHECK(a[i].path == Path::kCopy);
    CHECK_FALSE(a[i].timed);
  }
  for (uint64_t k = 0; k < kWindowOps3; ++k) {
    INFO("window operation " << k);
    const Plan& p = a[PathChooser::kWarmOps + k];
    CHECK(p.path == order[k / PathChooser::kBlockOps]);
    CHECK(p.timed == (k % PathChooser::kBlockOps >= PathChooser::kSettleOps));
  }
  const uint64_t close = PathChooser::kWarmOps + kWindowOps3;
  CHECK(a[close].windowClosed);
  // The next window starts kFirstGap operations after the close.
  CHECK_FALSE(a[close + PathChooser::kFirstGap - 1].timed);
  CHECK(a[close + PathChooser::kFirstGap + PathChooser::kSettleOps].timed);
}

TEST_CASE("paths: the fastest path by the group's medians is kept, the kept one unless beaten by the margin",
          "[path_chooser]") {
  const int cls = PathChooser::classOf(k1M);
  PathChooser c(kAll, Path::kCopy);
  drive(c, k1M, PathChooser::kWarmOps + kWindowOps3 + 1, costs(1.0, 0.5, 2.0));
  CHECK(c.windows(cls) == 1);
  CHECK(c.verdictDue(cls));
  CHECK(medians(c, cls) == std::array<double, 3>{1.0, 0.5, 2.0});
  // The group's slowest rank: streaming fastest there.
  c.decide(cls, {1.0, 0.9, 0.4});
  CHECK_FALSE(c.verdictDue(cls));
  CHECK(c.path(cls) == Path::kStreamingStores);
  CHECK(c.next(k1M).path == Path::kStreamingStores);
  // Within the margin of the kept path: no switch.
  PathChooser d(kAll, Path::kCopy);
  drive(d, k1M, PathChooser::kWarmOps + kWindowOps3 + 1, costs(1.0, 0.97, 1.2));
  d.decide(cls, medians(d, cls));
  CHECK(d.path(cls) == Path::kCopy);
  // A path without a figure (no rank measured it): nothing changes.
  PathChooser e(kAll, Path::kCopy);
  drive(e, k1M, PathChooser::kWarmOps + kWindowOps3 + 1, costs(1.0, 0.5, 2.0));
  e.decide(cls, {1.0, 0.5, 0.0});
  CHECK(e.path(cls) == Path::kCopy);
  // Undecided by the group, the next plan decides from this rank's medians.
  PathChooser f(kAll, Path::kCopy);
  drive(f, k1M, PathChooser::kWarmOps + kWindowOps3 + 1, costs(1.0, 0.5, 2.0));
  CHECK(f.next(k1M).path == Path::kCachedStores);
}

TEST_CASE("paths: one slow sample per path does not decide", "[path_chooser]") {
  const int cls = PathChooser::classOf(k1M);
  PathChooser c(kAll, Path::kCopy);
  int copies = 0;
  drive(c, k1M, PathChooser::kWarmOps + kWindowOps3 + 1, [&](Path p) {
    if (p == Path::kCopy) {
      return ++copies == 1 ? 50.0 : 1.0;  // one outlier among the copy samples
    }
    return 1.5;
  });
  c.decide(cls, medians(c, cls));
  CHECK(c.path(cls) == Path::kCopy);
}

TEST_CASE("paths: a forced override probes the zero-copy paths only; one path is never timed", "[path_chooser]") {
  PathChooser c(kZeroCopyOnly, Path::kCachedStores);
  const auto plans = drive(c, k64K, 300, costs(0.1, 2.0, 1.0));
  for (const Plan& p : plans) {
    CHECK(p.path != Path::kCopy);
  }
  CHECK(plans.back().path == Path::kStreamingStores);
  PathChooser one(0b010, Path::kCachedStores);
  for (const Plan& p : drive(one, k1M, 100, costs(1, 1, 1))) {
    CHECK(p.path == Path::kCachedStores);
    CHECK_FALSE(p.timed);
    CHECK_FALSE(p.windowClosed);
  }
  CHECK(one.windows(PathChooser::classOf(k1M)) == 0);
}

TEST_CASE("paths: size classes keep their own schedules and verdicts", "[path_chooser]") {
  PathChooser c(kAll, Path::kCopy);
  drive(c, k64K, PathChooser::kWarmOps + kWindowOps3 + 2, costs(0.5, 1.0, 1.0));
  drive(c, 16 * k1M, PathChooser::kWarmOps + kWindowOps3 + 2, costs(1.0, 1.0, 0.5));
  CHECK(c.path(PathChooser::classOf(k64K)) == Path::kCopy);
  CHECK(c.path(PathChooser::classOf(16 * k1M)) == Path::kStreamingStores);
  CHECK(c.windows(PathChooser::classOf(k1M)) == 0);
  CHECK(c.path(PathChooser::classOf(k1M)) == Path::kCopy);
}

}  // namespace tunedist::test
