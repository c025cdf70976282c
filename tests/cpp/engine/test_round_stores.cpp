// RoundStoreChooser, the slot stores of single-round operations, driven with chosen costs: its probe schedule is the
// same whatever the costs (so every rank probes on the same operations), a window closes one operation after its
// last probe and is decided at the next (from the group's slowest rank when given, else from this rank's medians), the
// faster mode is kept unless within the margin, one outlier does not decide, a window without samples of both modes
// changes nothing, size classes are apart. Then real groups: each family's chooser times real operations, every auto
// rank ends with the same picks, results stay exact whichever stores each rank ends up with.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

#include "shm/round_stores.h"
#include "shm_test_util.h"

namespace tunedist::test {
namespace {

using shm::RoundStoreChooser;
using Plan = RoundStoreChooser::Plan;
constexpr size_t k16K = size_t(16) << 10;

// Runs `ops` operations of `bytes`, recording `cost(streaming)` after each timed one; returns the plans.
template <typename Cost>
std::vector<Plan> drive(RoundStoreChooser& c, size_t bytes, uint64_t ops, Cost cost) {
  std::vector<Plan> plans;
  for (uint64_t i = 0; i < ops; ++i) {
    const Plan p = c.next(bytes);
    plans.push_back(p);
    if (p.timed) {
      c.record(cost(p.streaming));
    }
  }
  return plans;
}

// The operation that closes window w (0-based): the first after its probes.
uint64_t windowEnd(uint32_t w) {
  uint64_t start = RoundStoreChooser::kWarmOps;
  uint64_t gap = RoundStoreChooser::kFirstGap;
  for (uint32_t i = 0; i < w; ++i) {
    start += RoundStoreChooser::kWindowOps + gap;
    gap = std::min(2 * gap, RoundStoreChooser::kMaxGap);
  }
  return start + RoundStoreChooser::kWindowOps;
}

}  // namespace

TEST_CASE("round stores: size classes are powers of two from 8 KiB, the last one open-ended", "[round_stores]") {
  CHECK(RoundStoreChooser::classOf(RoundStoreChooser::kMinBytes) == 0);
  CHECK(RoundStoreChooser::classOf(k16K - 1) == 0);
  CHECK(RoundStoreChooser::classOf(k16K) == 1);
  CHECK(RoundStoreChooser::classOf((size_t(1) << 20) - 1) == 6);
  CHECK(RoundStoreChooser::classOf(size_t(1) << 20) == 7);
  CHECK(RoundStoreChooser::classOf(size_t(1) << 30) == RoundStoreChooser::kClasses - 1);
}

TEST_CASE("round stores: classes under the given size start streaming", "[round_stores]") {
  RoundStoreChooser c(size_t(512) << 10);
  for (int cls = 0; cls < RoundStoreChooser::kClasses; ++cls) {
    INFO("class " << cls);
    CHECK(c.streaming(cls) == (cls < 6));  // 8 KiB ... 256 KiB
  }
  CHECK(c.next(size_t(256) << 10).streaming);
  CHECK_FALSE(c.next(size_t(512) << 10).streaming);
  // Below kMinBytes the chooser says cached, untimed: its caller keeps its own rule there.
  CHECK_FALSE(c.next(RoundStoreChooser::kMinBytes - 1).streaming);
  CHECK_FALSE(RoundStoreChooser().streaming(0));
}

TEST_CASE("round stores: small operations are cached and never timed", "[round_stores]") {
  RoundStoreChooser c;
  for (int i = 0; i < 500; ++i) {
    const Plan p = c.next(RoundStoreChooser::kMinBytes - 1);
    CHECK_FALSE(p.streaming);
    CHECK_FALSE(p.timed);
  }
  for (int cls = 0; cls < RoundStoreChooser::kClasses; ++cls) {
    CHECK(c.windows(cls) == 0);
  }
}

TEST_CASE("round stores: the probe schedule is the same whatever the costs", "[round_stores]") {
  // Two ranks whose measurements disagree completely still probe on the same operations, in the same modes.
  RoundStoreChooser cheapStreaming, cheapCached;
  const uint64_t ops = windowEnd(6) + 10;
  const auto a = drive(cheapStreaming, k16K, ops, [](bool s) { return s ? 1.0 : 3.0; });
  const auto b = drive(cheapCached, k16K, ops, [](bool s) { return s ? 3.0 : 1.0; });
  uint64_t timed = 0;
  for (uint64_t i = 0; i < ops; ++i) {
    INFO("operation " << i);
    REQUIRE(a[i].timed == b[i].timed);
    if (a[i].timed) {
      ++timed;
      CHECK(a[i].streaming == b[i].streaming);
    }
  }
  CHECK(timed == 7 * 2 * RoundStoreChooser::kSamplesPerMode);
  // The warm-up is cached and untimed; the first window is cached, streaming, streaming, cached blocks, each
  // timed after its settling operations.
  for (uint64_t i = 0; i < RoundStoreChooser::kWarmOps; ++i) {
    CHECK_FALSE(a[i].streaming);
    CHECK_FALSE(a[i].timed);
  }
  const bool blockStreams[] = {false, true, true, false};
  for (uint64_t pos = 0; pos < RoundStoreChooser::kWindowOps; ++pos) {
    INFO("window position " << pos);
    const Plan& p = a[RoundStoreChooser::kWarmOps + pos];
    CHECK(p.streaming == blockStreams[pos / RoundStoreChooser::kBlockOps]);
    CHECK(p.timed == (pos % RoundStoreChooser::kBlockOps >= RoundStoreChooser::kSettleOps));
  }
  // The operation after the probes closes the window, still in the old mode; from the next one each keeps what it
  // measured as faster.
  CHECK(cheapStreaming.streaming(1));
  CHECK_FALSE(cheapCached.streaming(1));
  CHECK(cheapStreaming.windows(1) == 7);
  for (uint64_t i = 0; i < ops; ++i) {
    INFO("operation " << i);
    CHECK(a[i].windowClosed == (i == windowEnd(0) || i == windowEnd(1) || i == windowEnd(2) || i == windowEnd(3) ||
                                i == windowEnd(4) || i == windowEnd(5) || i == windowEnd(6)));
  }
  CHECK_FALSE(a[windowEnd(0)].streaming);
  for (uint64_t i = windowEnd(0) + 1; i < windowEnd(0) + RoundStoreChooser::kFirstGap; ++i) {
    CHECK(a[i].streaming);
    CHECK_FALSE(b[i].streaming);
    CHECK_FALSE(a[i].timed);
  }
  // The gap doubles up to kMaxGap: windows get rarer, never stop.
  CHECK(windowEnd(6) - windowEnd(5) == RoundStoreChooser::kWindowOps + RoundStoreChooser::kMaxGap);
}

TEST_CASE("round stores: switching needs the other mode faster by the margin, and goes back", "[round_stores]") {
  RoundStoreChooser c;
  uint64_t done = 0;
  // Drives class 1 up to the operation after window w's close, where its verdict is taken.
  auto throughWindow = [&](uint32_t w, double cached, double streaming) {
    drive(c, k16K, windowEnd(w) + 2 - done, [&](bool s) { return s ? streaming : cached; });
    done = windowEnd(w) + 2;
  };
  // Streaming 3% cheaper: within the margin, stays cached.
  throughWindow(0, 1.0, 0.97);
  CHECK_FALSE(c.streaming(1));
  CHECK(c.lastCachedNsPerByte(1) == Approx(1.0));
  CHECK(c.lastStreamingNsPerByte(1) == Approx(0.97));
  // 10% cheaper: streams.
  throughWindow(1, 1.0, 0.9);
  CHECK(c.streaming(1));
  // The host changes: cached 3% cheaper keeps streaming, 20% cheaper goes back.
  throughWindow(2, 0.97, 1.0);
  CHECK(c.streaming(1));
  throughWindow(3, 0.8, 1.0);
  CHECK_FALSE(c.streaming(1));
  // Nothing leaked into the other classes.
  for (int cls = 0; cls < RoundStoreChooser::kClasses; ++cls) {
    if (cls != 1) {
      CHECK(c.windows(cls) == 0);
      CHECK_FALSE(c.streaming(cls));
    }
  }
}

TEST_CASE("round stores: the group's slowest medians decide over this rank's own", "[round_stores]") {
  RoundStoreChooser c;
  // This rank measured streaming twice as fast; the window closes at windowEnd(0).
  drive(c, k16K, windowEnd(0) + 1, [](bool s) { return s ? 0.5 : 1.0; });
  REQUIRE(c.windows(1) == 1);
  REQUIRE(c.verdictDue(1));
  CHECK_FALSE(c.streaming(1));
  // The group's slowest rank (a peer that found streaming far dearer: 3.0 against its cached 1.0) keeps it cached.
  c.decide(1, std::max(1.0, 1.0), std::max(0.5, 3.0));
  CHECK_FALSE(c.verdictDue(1));
  CHECK_FALSE(c.next(k16K).streaming);
  // Next window: the group agrees streaming is faster.
  drive(c, k16K, windowEnd(1) - windowEnd(0) - 1, [](bool s) { return s ? 0.5 : 1.0; });
  REQUIRE(c.verdictDue(1));
  c.decide(1, 2.0, 1.0);
  CHECK(c.streaming(1));
  // Zeros (no rank shared both modes) change nothing.
  drive(c, k16K, windowEnd(2) - windowEnd(1), [](bool s) { return s ? 5.0 : 1.0; });
  REQUIRE(c.verdictDue(1));
  c.decide(1, 0, 0);
  CHECK(c.streaming(1));
  CHECK_FALSE(c.verdictDue(1));
}

TEST_CASE("round stores: the median decides, not one stretched operation", "[round_stores]") {
  RoundStoreChooser c;
  int cachedSeen = 0;
  // One cached sample hit by an interrupt (100x); the others say cached is the faster.
  drive(c, k16K, windowEnd(0) + 2, [&](bool s) { return s ? 1.0 : (cachedSeen++ == 1 ? 100.0 : 0.5); });
  CHECK_FALSE(c.streaming(1));
  CHECK(c.lastCachedNsPerByte(1) == Approx(0.5));
}

TEST_CASE("round stores: a window missing a mode's samples (failed operations) changes nothing", "[round_stores]") {
  RoundStoreChooser c;
  for (uint64_t i = 0; i < windowEnd(0) + 1; ++i) {
    const Plan p = c.next(k16K);
    if (p.timed && !p.streaming) {
      c.record(10.0);  // streaming operations never report: they all failed
    }
  }
  // A report with nothing pending is ignored.
  c.record(0.001);
  const Plan after = c.next(k16K);
  CHECK_FALSE(after.streaming);
  CHECK_FALSE(after.timed);
  CHECK(c.windows(1) == 1);
  CHECK(c.lastCachedNsPerByte(1) == Approx(10.0));
  CHECK(c.lastStreamingNsPerByte(1) == 0);
  // The next window decides normally.
  drive(c, k16K, windowEnd(1) + 2 - (windowEnd(0) + 2), [](bool s) { return s ? 1.0 : 10.0; });
  CHECK(c.streaming(1));
}

TEST_CASE("round stores: a drift of the kept mode between windows asks for a window", "[round_stores]") {
  const size_t k1M = size_t(1) << 20;
  const int cls = RoundStoreChooser::classOf(k1M);
  RoundStoreChooser c;
  // The first window keeps cached (1.0 against 2.0 ns per byte).
  drive(c, k1M, windowEnd(0) + 2, [](bool s) { return s ? 2.0 : 1.0; });
  REQUIRE_FALSE(c.streaming(cls));
  REQUIRE(c.lastCachedNsPerByte(cls) == Approx(1.0));
  // Between windows every operation of at least kDriftMinBytes is timed; costs within kDriftFactor ask nothing.
  auto plans = drive(c, k1M, 3 * RoundStoreChooser::kDriftOps, [](bool) { return 1.4; });
  for (const Plan& p : plans) {
    CHECK(p.timed);
    CHECK_FALSE(p.streaming);
  }
  CHECK_FALSE(c.probeWanted(cls));
  // kDriftOps in a row at 1.6x ask for a window; nothing is timed after that until it starts.
  plans = drive(c, k1M, RoundStoreChooser::kDriftOps, [](bool) { return 1.6; });
  CHECK(c.probeWanted(cls));
  CHECK_FALSE(c.next(k1M).timed);
  // Smaller operations of the class are never timed between windows.
  RoundStoreChooser small;
  drive(small, size_t(64) << 10, windowEnd(0) + 2, [](bool s) { return s ? 2.0 : 1.0; });
  for (const Plan& p : drive(small, size_t(64) << 10, 8, [](bool) { return 9.0; })) {
    CHECK_FALSE(p.timed);
  }
  // The group starts it at the class's next operation: the window's schedule from there, and the ask is cleared.
  c.startWindowNext(cls);
  const uint32_t before = c.windows(cls);
  plans = drive(c, k1M, RoundStoreChooser::kWindowOps + 1, [](bool s) { return s ? 1.5 : 3.0; });
  const bool blockStreams[] = {false, true, true, false};
  for (uint64_t pos = 0; pos < RoundStoreChooser::kWindowOps; ++pos) {
    INFO("window position " << pos);
    CHECK(plans[pos].streaming == blockStreams[pos / RoundStoreChooser::kBlockOps]);
    CHECK(plans[pos].timed == (pos % RoundStoreChooser::kBlockOps >= RoundStoreChooser::kSettleOps));
  }
  CHECK(plans[RoundStoreChooser::kWindowOps].windowClosed);
  CHECK(c.windows(cls) == before + 1);
  CHECK_FALSE(c.probeWanted(cls));
  // Decided at the next operation: streaming is now the faster.
  c.next(k1M);
  CHECK(c.streaming(cls));
  // Inside an open window an ask changes nothing.
  RoundStoreChooser w;
  drive(w, k1M, RoundStoreChooser::kWarmOps + 3, [](bool) { return 1.0; });
  w.startWindowNext(cls);
  const auto rest = drive(w, k1M, RoundStoreChooser::kWindowOps - 3 + 1, [](bool) { return 1.0; });
  CHECK(rest.back().windowClosed);
}

TEST_CASE("round stores: one rank's ask starts the window on every rank at the same operation", "[round_stores][shm]") {
  const int size = GENERATE(2, 3);
  ShmLeakCheck leaks;
  ShmOptions o;
  o.slotBytes = size_t(64) << 10;
  o.oneShotMaxBytes = size_t(64) << 10;
  o.spinIters = kTestSpinIters;
  const size_t count = k16K / sizeof(float);
  const int cls = RoundStoreChooser::classOf(k16K);
  // After the first window is decided, the last rank asks; one operation carries the ask, the next starts a window
  // on every rank, which closes kWindowOps later: long before the scheduled second window (windowEnd(1)).
  const uint64_t askAt = windowEnd(0) + 2;
  const uint64_t ops = askAt + 1 + RoundStoreChooser::kWindowOps + 1;
  REQUIRE(ops < windowEnd(1));
  std::vector<uint32_t> windows(static_cast<size_t>(size));
  auto rendezvous = std::make_shared<MemRendezvous>();
  rethrowFailures(spawn(size, [&](int r) {
    Peer p(rendezvous, r, size, o);
    abortingOnThrow({&p.comm}, [&] {
      std::vector<float> in(count, float(r + 1)), out(count);
      for (uint64_t i = 0; i < ops; ++i) {
        if (i == askAt && r == size - 1) {
          p.comm.roundStoreChooser(shm::StorePolicy::kOneShotAllreduce).askForWindow(cls);
        }
        p.comm.allreduce(p.op("all_reduce"), in.data(), out.data(), count, floatSum());
        const float want = float(size * (size + 1) / 2);
        if (out[0] != want || out[count - 1] != want) {
          failAt(core::detail::str("all_reduce op ", i), r, 0, out[0], want);
        }
      }
      windows[size_t(r)] = p.comm.roundStoreChooser(shm::StorePolicy::kOneShotAllreduce).windows(cls);
    });
  }));
  for (int r = 0; r < size; ++r) {
    INFO("rank " << r);
    CHECK(windows[size_t(r)] == 2);
  }
  CHECK(leaks.report() == "");
}

TEST_CASE("round stores: real groups time their operations, of one round or many, and stay exact",
          "[round_stores][shm]") {
  const int size = GENERATE(2, 3);
  // One round: every operation fits a slot, all_reduce is one-shot. Many: 8 KiB slots, so 16 KiB takes two rounds
  // of all_gather and broadcast, several of reduce_scatter, and all_reduce runs two-shot.
  const bool manyRounds = GENERATE(false, true);
  // A rank forced to a mode uses no round chooser; the auto ranks' choosers still probe on the same operations.
  const core::SlotStores rank1 = GENERATE(core::SlotStores::kAuto, core::SlotStores::kStreaming,
                                          core::SlotStores::kCached);
  INFO("world size " << size << ", rank 1's slot stores " << int(rank1) << (manyRounds ? ", many rounds" : ""));
  ShmLeakCheck leaks;
  ShmOptions base;
  base.slotBytes = manyRounds ? size_t(8) << 10 : size_t(64) << 10;
  base.oneShotMaxBytes = manyRounds ? size_t(4) << 10 : size_t(64) << 10;
  base.spinIters = kTestSpinIters;
  const size_t bytes = k16K;
  const size_t count = bytes / sizeof(float);
  // Enough operations of each family for two windows, both decided.
  const int ops = int(windowEnd(1)) + 2;
  // Each auto rank's final picks, per family: they must agree.
  std::vector<std::vector<int>> picks(static_cast<size_t>(size));
  auto rendezvous = std::make_shared<MemRendezvous>();
  rethrowFailures(spawn(size, [&](int r) {
    ShmOptions o = base;
    if (r == 1) {
      o.slotStores = rank1;
    }
    Peer p(rendezvous, r, size, o);
    abortingOnThrow({&p.comm}, [&] {
      std::vector<float> in(count * size_t(size)), out(count * size_t(size));
      std::vector<const void*> ins(static_cast<size_t>(size));
      std::vector<void*> outs(static_cast<size_t>(size));
      // reduce_scatter with blocks that make each rank write `bytes` into its slot.
      const size_t rsCount = count / size_t(size - 1);
      for (int i = 0; i < ops; ++i) {
        // Every element is small integers, so every sum is exact; they change with i, so stale slots would show.
        for (size_t e = 0; e < in.size(); ++e) {
          in[e] = float((size_t(r) * 7 + e + size_t(i)) % 13);
        }
        auto want = [&](size_t e) {
          double sum = 0;
          for (int q = 0; q < size; ++q) {
            sum += double((size_t(q) * 7 + e + size_t(i)) % 13);
          }
          return sum;
        };
        p.comm.allreduce(p.op("all_reduce"), in.data(), out.data(), count, floatSum());
        for (size_t e = 0; e < count; ++e) {
          if (out[e] != want(e)) {
            failAt(core::detail::str("all_reduce op ", i), r, e, out[e], want(e));
          }
        }
        for (int q = 0; q < size; ++q) {
          outs[size_t(q)] = out.data() + size_t(q) * count;
        }
        p.comm.allgather(p.op("all_gather"), in.data(), bytes, outs.data());
        for (int q = 0; q < size; ++q) {
          for (size_t e = 0; e < count; ++e) {
            const float w = float((size_t(q) * 7 + e + size_t(i)) % 13);
            if (out[size_t(q) * count + e] != w) {
              failAt(core::detail::str("all_gather op ", i, " block ", q), r, e, out[size_t(q) * count + e], w);
            }
          }
        }
        for (int q = 0; q < size; ++q) {
          ins[size_t(q)] = in.data() + size_t(q) * rsCount;
        }
        p.comm.reduceScatter(p.op("reduce_scatter"), ins.data(), out.data(), rsCount, floatSum());
        for (size_t e = 0; e < rsCount; ++e) {
          const double w = want(size_t(r) * rsCount + e);
          if (out[e] != w) {
            failAt(core::detail::str("reduce_scatter op ", i), r, e, out[e], w);
          }
        }
        // broadcast from every root in turn: the root's input, everybody else's stale output.
        const int root = i % size;
        std::copy(in.begin(), in.begin() + long(count), out.begin());
        p.comm.broadcast(p.op("broadcast"), out.data(), bytes, root);
        for (size_t e = 0; e < count; ++e) {
          const float w = float((size_t(root) * 7 + e + size_t(i)) % 13);
          if (out[e] != w) {
            failAt(core::detail::str("broadcast op ", i, " from root ", root), r, e, out[e], w);
          }
        }
        // reduce to the same root: the sum of every rank's first `count` elements.
        p.comm.reduce(p.op("reduce"), in.data(), out.data(), count, floatSum(), root);
        for (size_t e = 0; e < count && r == root; ++e) {
          if (out[e] != want(e)) {
            failAt(core::detail::str("reduce op ", i, " to root ", root), r, e, out[e], want(e));
          }
        }
        // gather to it: block q is rank q's first `count` elements.
        for (int q = 0; q < size; ++q) {
          outs[size_t(q)] = out.data() + size_t(q) * count;
        }
        p.comm.gather(p.op("gather"), in.data(), bytes, outs.data(), root);
        for (size_t e = 0; e < count * size_t(size) && r == root; ++e) {
          const float w = float(((e / count) * 7 + e % count + size_t(i)) % 13);
          if (out[e] != w) {
            failAt(core::detail::str("gather op ", i, " to root ", root), r, e, out[e], w);
          }
        }
        // scatter from it, and all_to_all: rank q gets block q of the root's input, of every rank's.
        for (int q = 0; q < size; ++q) {
          ins[size_t(q)] = in.data() + size_t(q) * count;
        }
        p.comm.scatter(p.op("scatter"), ins.data(), out.data(), bytes, root);
        for (size_t e = 0; e < count; ++e) {
          const float w = float((size_t(root) * 7 + size_t(r) * count + e + size_t(i)) % 13);
          if (out[e] != w) {
            failAt(core::detail::str("scatter op ", i, " from root ", root), r, e, out[e], w);
          }
        }
        const std::vector<size_t> blockBytes(static_cast<size_t>(size), bytes);
        p.comm.alltoallv(p.op("all_to_all"), ins.data(), blockBytes.data(), outs.data(), blockBytes.data());
        for (size_t e = 0; e < count * size_t(size); ++e) {
          const float w = float(((e / count) * 7 + size_t(r) * count + e % count + size_t(i)) % 13);
          if (out[e] != w) {
            failAt(core::detail::str("all_to_all op ", i), r, e, out[e], w);
          }
        }
      }
      // The auto ranks timed real operations in both modes of every family: two windows each, with their medians.
      if (o.slotStores == core::SlotStores::kAuto) {
        const auto allreduce = manyRounds ? shm::StorePolicy::kTwoShotAllreduce : shm::StorePolicy::kOneShotAllreduce;
        for (auto family : {allreduce, shm::StorePolicy::kAllgather, shm::StorePolicy::kReduceScatter,
                            shm::StorePolicy::kBroadcast, shm::StorePolicy::kReduce, shm::StorePolicy::kGather,
                            shm::StorePolicy::kScatter, shm::StorePolicy::kAlltoall}) {
          const RoundStoreChooser& c = p.comm.roundStoreChooser(family);
          // What each family's size class counts: all a rank writes into its slot, the scatter root's peer blocks,
          // all_to_all's P x the largest block.
          size_t classBytes = bytes;
          if (family == shm::StorePolicy::kReduceScatter) {
            classBytes = rsCount * sizeof(float) * size_t(size - 1);
          } else if (family == shm::StorePolicy::kScatter) {
            classBytes = bytes * size_t(size - 1);
          } else if (family == shm::StorePolicy::kAlltoall) {
            classBytes = bytes * size_t(size);
          }
          const int cls = RoundStoreChooser::classOf(classBytes);
          if (c.windows(cls) != 2 || !(c.lastCachedNsPerByte(cls) > 0) || !(c.lastStreamingNsPerByte(cls) > 0)) {
            failCheck("family ", int(family), " class ", cls, ": ", c.windows(cls), " windows, medians ",
                      c.lastCachedNsPerByte(cls), " / ", c.lastStreamingNsPerByte(cls), " ns per byte");
          }
          picks[size_t(r)].push_back(c.streaming(cls) ? 1 : 0);
        }
        // The all_reduce algorithm that did not run timed nothing.
        const auto other = manyRounds ? shm::StorePolicy::kOneShotAllreduce : shm::StorePolicy::kTwoShotAllreduce;
        for (int cls = 0; cls < RoundStoreChooser::kClasses; ++cls) {
          if (p.comm.roundStoreChooser(other).windows(cls) != 0) {
            failCheck("rank ", r, ": the all_reduce family ", int(other), " that never ran has windows in class ", cls);
          }
        }
      } else {
        for (int family = 0; family < shm::kRoundFamilies; ++family) {
          if (p.comm.roundStoreChooser(shm::StorePolicy::Family(family)).windows(1) != 0) {
            failCheck("rank ", r, " with slot stores ", int(o.slotStores), " ran the round chooser of family ",
                      int(family));
          }
        }
      }
    });
  }));
  // The auto ranks decided every window together from the same medians: the same picks.
  for (int r = 1; r < size; ++r) {
    if (!picks[size_t(r)].empty()) {
      CHECK(picks[size_t(r)] == picks[0]);
    }
  }
  CHECK(leaks.report() == "");
}

}  // namespace tunedist::test
