// PathChooser, the zero-copy-or-copy choice of collectives on symmetric buffers, driven with chosen costs: its probe
// schedule is the same whatever the costs (every rank probes the same path in the same operation), a window closes one
// operation after its last probe and is decided at the next, the fastest path by the slowest rank's medians is kept
// unless the kept one is within the margin, a window without a figure for some path changes nothing, a forced
// override probes only the zero-copy paths, one allowed path is never timed, size classes are apart; and ranks whose
// costs differ (each rank its own noise) plan the same path, timing and window close at every operation when they
// decide from the group's slowest medians.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <random>
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

namespace tunedist::test {
namespace {

// A group of ranks, each with its own chooser, run as ZeroCopyCollectives runs them: before a rank's next operation
// of a class whose window closed, the verdict from the slowest rank's medians over the ranks that have a figure for
// every allowed path (peers.cpp decideDue). cost(rank, op, path) is a rank's cost of an operation.
struct Group {
  std::vector<PathChooser> ranks;
  Group(int n, uint32_t allowed, Path initial) : ranks(size_t(n), PathChooser(allowed, initial)) {}

  template <typename Cost>
  std::vector<std::vector<Plan>> run(size_t bytes, uint64_t ops, Cost cost) {
    const int cls = PathChooser::classOf(bytes);
    std::vector<std::vector<Plan>> plans(ranks.size());
    for (uint64_t op = 0; op < ops; ++op) {
      // Every rank published its medians when the window closed (one operation ago): they read them now.
      std::array<double, 3> slowest{};
      for (const PathChooser& r : ranks) {
        bool complete = true;
        for (int k = 0; k < 3; ++k) {
          complete = complete && (!(r.allowed() & (1u << k)) || r.lastMedian(cls, Path(k)) > 0);
        }
        for (int k = 0; k < 3 && complete; ++k) {
          slowest[size_t(k)] = std::max(slowest[size_t(k)], r.lastMedian(cls, Path(k)));
        }
      }
      for (size_t rank = 0; rank < ranks.size(); ++rank) {
        PathChooser& r = ranks[rank];
        if (r.verdictDue(cls)) {
          r.decide(cls, slowest);
        }
        const Plan p = r.next(bytes);
        plans[rank].push_back(p);
        if (p.timed) {
          r.record(cost(int(rank), op, p.path));
        }
      }
    }
    return plans;
  }
};

uint64_t countPath(const std::vector<Plan>& plans, Path path, uint64_t from, uint64_t to) {
  uint64_t n = 0;
  for (uint64_t i = from; i < std::min<uint64_t>(to, plans.size()); ++i) {
    n += plans[i].path == path;
  }
  return n;
}

}  // namespace

TEST_CASE("paths: ranks with different costs keep the same schedule and decisions at every operation",
          "[path_chooser]") {
  // Four ranks, each with its own noise around a host that changes twice; the group decides from the slowest rank,
  // and every rank must plan the same path, timing and window close at every operation.
  for (uint32_t seed = 1; seed <= 24; ++seed) {
    INFO("seed " << seed);
    const uint32_t allowed = seed % 3 == 0 ? kZeroCopyOnly : kAll;
    Group g(4, allowed, allowed == kAll ? Path::kCopy : Path::kCachedStores);
    std::vector<std::mt19937> rng;
    for (int r = 0; r < 4; ++r) {
      rng.emplace_back(seed * 131 + uint32_t(r));
    }
    const double noise = 0.05 * double(seed % 8);
    const uint64_t ops = 12000;
    const auto plans = g.run(k1M, ops, [&](int rank, uint64_t op, Path p) {
      // Regimes: copy wins, then cached, then streaming by a hair.
      const std::array<double, 3> base = op < 3000   ? std::array<double, 3>{1.0, 1.6, 2.4}
                                         : op < 7000 ? std::array<double, 3>{1.0, 0.55, 0.9}
                                                     : std::array<double, 3>{1.0, 0.7, 0.66};
      std::uniform_real_distribution<double> u(1.0, 1.0 + noise + 0.1 * rank);
      return base[size_t(p)] * u(rng[size_t(rank)]);
    });
    const int cls = PathChooser::classOf(k1M);
    for (size_t r = 1; r < plans.size(); ++r) {
      for (uint64_t i = 0; i < ops; ++i) {
        if (plans[r][i].path != plans[0][i].path || plans[r][i].timed != plans[0][i].timed ||
            plans[r][i].windowClosed != plans[0][i].windowClosed) {
          FAIL("rank " << r << " differs from rank 0 at operation " << i);
        }
      }
      CHECK(g.ranks[r].path(cls) == g.ranks[0].path(cls));
      CHECK(g.ranks[r].windows(cls) == g.ranks[0].windows(cls));
    }
    // The group followed the host: each regime's clear winner was kept by its end.
    if (allowed == kAll) {
      CHECK(countPath(plans[0], Path::kCopy, 2900, 3000) == 100);
      CHECK(countPath(plans[0], Path::kCachedStores, 6900, 7000) == 100);
    }
  }
}

}  // namespace tunedist::test
