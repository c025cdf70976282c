// SlotCopyIn: every store mode copies exactly the bytes asked for. SlotStoreChooser, the auto mode's policy, driven
// with chosen costs: warm-up, moving average, the switch to streaming, probes and the way back, outliers.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "core/options.h"
#include "scoped_env.h"
#include "shm/copy_in.h"

namespace tunedist::test {
namespace {

using core::SlotStores;
using shm::SlotCopyIn;
using shm::SlotStoreChooser;
using Next = SlotStoreChooser::Next;
constexpr size_t kBig = SlotStoreChooser::kTimedMinBytes;

std::vector<uint8_t> pattern(size_t n, uint8_t salt) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = uint8_t(i * 131 + salt);
  }
  return v;
}

// The next copy, once the cached average holds kMinSamples: kTimeEvery - 1 untimed cached copies come first.
Next nextSampled(SlotStoreChooser& c) {
  for (uint32_t i = 1; i < SlotStoreChooser::kTimeEvery; ++i) {
    REQUIRE(c.next(kBig) == Next::kCachedUntimed);
  }
  return c.next(kBig);
}

// Past the warm-up, with `n` timed copies of cost `ns` recorded (cached all along).
SlotStoreChooser warmedWith(int n, double ns) {
  SlotStoreChooser c;
  for (uint64_t i = 0; i < SlotStoreChooser::kWarmCopies; ++i) {
    REQUIRE(c.next(kBig) == Next::kCachedUntimed);
  }
  for (int i = 0; i < n; ++i) {
    REQUIRE((uint32_t(i) < SlotStoreChooser::kMinSamples ? c.next(kBig) : nextSampled(c)) == Next::kCachedTimed);
    c.record(ns);
  }
  return c;
}

// Streams up to the next probe, then runs the probe's copies with these costs.
void probe(SlotStoreChooser& c, std::initializer_list<double> costs) {
  REQUIRE(costs.size() == SlotStoreChooser::kProbeCopies);
  for (uint32_t i = 1; i < SlotStoreChooser::kProbeEvery; ++i) {
    REQUIRE(c.next(kBig) == Next::kStreaming);
  }
  for (double ns : costs) {
    REQUIRE(c.next(kBig) == Next::kCachedTimed);
    c.record(ns);
  }
}

}  // namespace

TEST_CASE("every slot store mode copies exactly the bytes asked for", "[copy_in]") {
  const SlotStores mode = GENERATE(SlotStores::kAuto, SlotStores::kCached, SlotStores::kStreaming,
                                   SlotStores::kAutoPerCopy);
  const bool readersOnly = GENERATE(false, true);  // copyStreamingUnlessForced (a broadcast root's copy)
  SlotCopyIn copier(mode);
  for (size_t bytes : {size_t(0), size_t(1), size_t(63), kBig - 1, kBig, size_t(65537), size_t(1) << 20}) {
    for (size_t shift : {size_t(0), size_t(3)}) {
      INFO("mode " << int(mode) << (readersOnly ? " (streaming unless forced)" : "") << ", " << bytes
                   << " bytes, destination shifted by " << shift);
      const auto src = pattern(bytes + shift, uint8_t(bytes));
      std::vector<uint8_t> dst(bytes + 2 * shift + 64, 0xA5);
      if (readersOnly) {
        copier.copyStreamingUnlessForced(dst.data() + shift, src.data() + shift, bytes);
      } else {
        copier.copy(dst.data() + shift, src.data() + shift, bytes);
      }
      CHECK(std::equal(src.begin() + long(shift), src.end(), dst.begin() + long(shift)));
      for (size_t i = 0; i < shift; ++i) {
        CHECK(dst[i] == 0xA5);
      }
      for (size_t i = shift + bytes; i < dst.size(); ++i) {
        CHECK(dst[i] == 0xA5);
      }
    }
  }
}

TEST_CASE("auto: small copies are never timed, and the first big ones (page faults) are not counted", "[copy_in]") {
  SlotStoreChooser c;
  for (int i = 0; i < 100; ++i) {
    CHECK(c.next(kBig - 1) == Next::kCachedUntimed);
  }
  for (uint64_t i = 0; i < SlotStoreChooser::kWarmCopies; ++i) {
    CHECK(c.next(kBig) == Next::kCachedUntimed);
  }
  CHECK(c.next(kBig) == Next::kCachedTimed);
  CHECK(c.next(kBig - 1) == Next::kCachedUntimed);
}

TEST_CASE("auto: dear copies turn to streaming once the average has enough samples", "[copy_in]") {
  SlotStoreChooser c = warmedWith(int(SlotStoreChooser::kMinSamples) - 1, 30);
  CHECK_FALSE(c.streaming());
  REQUIRE(c.next(kBig) == Next::kCachedTimed);
  c.record(30);
  CHECK(c.streaming());
  CHECK(c.nsPerLine() == Approx(30));
  CHECK(c.next(kBig) == Next::kStreaming);
  CHECK(c.next(kBig - 1) == Next::kCachedUntimed);
}

TEST_CASE("auto: cheap copies stay cached, and one copy stretched far beyond the rest does not flip it", "[copy_in]") {
  SlotStoreChooser c = warmedWith(8, 6.5);
  CHECK_FALSE(c.streaming());
  REQUIRE(nextSampled(c) == Next::kCachedTimed);
  c.record(100000);  // an interrupt in the middle of a copy
  CHECK_FALSE(c.streaming());
  REQUIRE(nextSampled(c) == Next::kCachedTimed);
  c.record(100000);  // a second one in a row is a trend
  CHECK(c.streaming());
}

TEST_CASE("auto: once the cached average holds kMinSamples, one copy in kTimeEvery is timed", "[copy_in]") {
  SlotStoreChooser c = warmedWith(int(SlotStoreChooser::kMinSamples) - 1, 6.5);
  // The last sample the average needs is timed at once; from then on the copies between samples are not.
  REQUIRE(c.next(kBig) == Next::kCachedTimed);
  c.record(6.5);
  for (int sample = 0; sample < 3; ++sample) {
    for (uint32_t i = 1; i < SlotStoreChooser::kTimeEvery; ++i) {
      CHECK(c.next(kBig) == Next::kCachedUntimed);
      CHECK(c.next(kBig - 1) == Next::kCachedUntimed);  // small copies neither timed nor counted
    }
    REQUIRE(c.next(kBig) == Next::kCachedTimed);
    c.record(6.5);
  }
  CHECK(c.samples() == SlotStoreChooser::kMinSamples + 3);
  CHECK_FALSE(c.streaming());
}

TEST_CASE("auto: while streaming, a probe every kProbeEvery copies decides on its last copies alone", "[copy_in]") {
  SlotStoreChooser c = warmedWith(int(SlotStoreChooser::kMinSamples), 30);
  REQUIRE(c.streaming());
  // Still dear: stay streaming, and the next probe comes kProbeEvery copies later.
  probe(c, {38, 37, 25, 30});
  CHECK(c.streaming());
  // The probe's first copies are dear (they take back lines the streaming left with the peers), its last ones cheap:
  // the steady state is cheap, so copies are cached again.
  probe(c, {38, 37, 3, 2.5});
  CHECK_FALSE(c.streaming());
  CHECK(c.nsPerLine() == Approx(2.75));
  CHECK(nextSampled(c) == Next::kCachedTimed);  // the probe counts as a full average: sampled at once
  // Between the thresholds a probe changes nothing.
  c.record(30);
  c.record(30);
  c.record(30);
  REQUIRE(c.streaming());
  probe(c, {38, 37, 12, 13});
  CHECK(c.streaming());
}

TEST_CASE("copyTwice fills the slot and the own block in one pass unless it times the slot's copy", "[copy_in]") {
  const SlotStores mode = GENERATE(SlotStores::kAuto, SlotStores::kCached, SlotStores::kStreaming,
                                   SlotStores::kAutoPerCopy);
  const bool streamOwn = GENERATE(false, true);
  SlotCopyIn copier(mode);
  for (size_t bytes : {size_t(0), size_t(63), kBig, size_t(65537)}) {
    // Enough copies to pass the warm-up, so kAuto's timed copies (apart from the own block's) run too.
    for (uint64_t round = 0; round < SlotStoreChooser::kWarmCopies + 2; ++round) {
      INFO("mode " << int(mode) << ", " << bytes << " bytes, copy " << round << (streamOwn ? ", own streaming" : ""));
      const auto src = pattern(bytes, uint8_t(bytes + round));
      std::vector<uint8_t> slot(bytes + 64, 0xA5), own(bytes + 64, 0x5A);
      const bool ownCopied = copier.copyTwice(slot.data() + 1, own.data() + 3, src.data(), bytes, streamOwn);
      CHECK(std::equal(src.begin(), src.end(), slot.begin() + 1));
      CHECK((slot[0] == 0xA5 && slot[bytes + 1] == 0xA5 && own[2] == 0x5A && own[bytes + 3] == 0x5A));
      if (ownCopied) {
        CHECK(std::equal(src.begin(), src.end(), own.begin() + 3));
      } else {  // a timed copy: the slot's alone, the own block untouched for the caller
        CHECK(bytes >= kBig);
        CHECK(std::all_of(own.begin(), own.end(), [](uint8_t v) { return v == 0x5A; }));
      }
      if (mode == SlotStores::kCached || mode == SlotStores::kStreaming || bytes < kBig) {
        CHECK(ownCopied);  // forced stores, or too small to time: always one pass
      }
    }
  }
  // Past the chooser's warm-up the auto modes' copies are timed (the slot's copy alone, as copy() records it: at
  // least the 2 kBig copies after the warm-up; the 65537-byte ones may stream once the average is high); forced
  // modes never time.
  if (mode == SlotStores::kAuto || mode == SlotStores::kAutoPerCopy) {
    CHECK(copier.chooser().samples() >= 2);
  } else {
    CHECK(copier.chooser().samples() == 0);
  }
}

TEST_CASE("auto: once the chooser samples, copyTwice fuses all but the one timed copy in kTimeEvery", "[copy_in]") {
  SlotCopyIn copier(SlotStores::kAuto);
  const auto src = pattern(kBig, 7);
  std::vector<uint8_t> slot(kBig), own(kBig);
  const uint64_t warm = SlotStoreChooser::kWarmCopies + SlotStoreChooser::kMinSamples;
  uint64_t fusedAfterWarm = 0;
  for (uint64_t i = 0; i < warm + 3 * SlotStoreChooser::kTimeEvery; ++i) {
    INFO("copy " << i);
    std::fill(own.begin(), own.end(), uint8_t(0));
    const uint32_t samplesBefore = copier.chooser().samples();
    const bool ownCopied = copier.copyTwice(slot.data(), own.data(), src.data(), kBig, false);
    REQUIRE(slot == src);
    // Exactly the timed copies (those the chooser recorded) leave the own block to the caller.
    REQUIRE(ownCopied == (copier.chooser().samples() == samplesBefore));
    REQUIRE((ownCopied ? own == src : std::all_of(own.begin(), own.end(), [](uint8_t v) { return v == 0; })));
    fusedAfterWarm += (i >= warm && ownCopied) ? 1 : 0;
  }
  // Cached all along (this host's copies averaged under the streaming threshold): one copy in kTimeEvery was timed.
  // Streaming (a slow host, a sanitizer build) fuses every copy but a probe's (kProbeCopies in kProbeEvery).
  CHECK(fusedAfterWarm + SlotStoreChooser::kProbeCopies >= 3 * SlotStoreChooser::kTimeEvery);
  if (!copier.streaming() && copier.chooser().samples() == SlotStoreChooser::kMinSamples + 3) {
    CHECK(fusedAfterWarm == 3 * (SlotStoreChooser::kTimeEvery - 1));
  }
}

TEST_CASE("forced modes copy without the chooser", "[copy_in]") {
  const SlotStores mode = GENERATE(SlotStores::kCached, SlotStores::kStreaming);
  SlotCopyIn c(mode);
  std::vector<uint8_t> src(64 << 10, 1), dst(64 << 10);
  for (int i = 0; i < 100; ++i) {
    c.copy(dst.data(), src.data(), src.size());
  }
  CHECK(c.chooser().samples() == 0);
  CHECK(c.streaming() == (mode == SlotStores::kStreaming));
}

TEST_CASE("auto copies time themselves after the warm-up", "[copy_in]") {
  SlotCopyIn c(SlotStores::kAuto);
  std::vector<uint8_t> src(kBig, 1), dst(kBig);
  for (uint64_t i = 0; i < SlotStoreChooser::kWarmCopies + 3; ++i) {
    c.copy(dst.data(), src.data(), kBig);
  }
  CHECK(c.chooser().samples() == 3);
  CHECK(c.chooser().nsPerLine() > 0);
}

TEST_CASE("auto: copies that stream unless forced are neither timed nor counted toward the warm-up", "[copy_in]") {
  SlotCopyIn c(SlotStores::kAuto);
  std::vector<uint8_t> src(kBig, 1), dst(kBig);
  for (int i = 0; i < 50; ++i) {
    c.copyStreamingUnlessForced(dst.data(), src.data(), kBig);
  }
  CHECK(c.chooser().samples() == 0);
  CHECK_FALSE(c.streaming());
  // The chooser's own copies still start with the whole warm-up.
  for (uint64_t i = 0; i < SlotStoreChooser::kWarmCopies + 2; ++i) {
    c.copy(dst.data(), src.data(), kBig);
  }
  CHECK(c.chooser().samples() == 2);
}

TEST_CASE("TUNEDIST_SLOT_STORES forces the slot stores, and a bad value names the variable", "[copy_in][options]") {
  CHECK(core::ShmOptions{}.slotStores == SlotStores::kAuto);
  {
    ScopedEnv env("TUNEDIST_SLOT_STORES", "streaming");
    CHECK(core::ShmOptions::fromEnv().slotStores == SlotStores::kStreaming);
  }
  {
    ScopedEnv env("TUNEDIST_SLOT_STORES", "cached");
    CHECK(core::ShmOptions::fromEnv().slotStores == SlotStores::kCached);
  }
  {
    ScopedEnv env("TUNEDIST_SLOT_STORES", "auto");
    CHECK(core::ShmOptions::fromEnv().slotStores == SlotStores::kAuto);
  }
  {
    ScopedEnv env("TUNEDIST_SLOT_STORES", "per-copy");
    CHECK(core::ShmOptions::fromEnv().slotStores == SlotStores::kAutoPerCopy);
  }
  ScopedEnv env("TUNEDIST_SLOT_STORES", "fast");
  CHECK_THROWS_WITH(core::ShmOptions::fromEnv(), Catch::Contains("TUNEDIST_SLOT_STORES") && Catch::Contains("fast"));
}

}  // namespace tunedist::test
