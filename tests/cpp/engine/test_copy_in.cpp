// SlotCopyIn: every store mode copies exactly the bytes asked for, and the auto mode's choice between cached and
// streaming stores follows the measured cost (warm-up, moving average, hysteresis, probe cadence).
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "core/options.h"
#include "scoped_env.h"
#include "shm/copy_in.h"

namespace tunedist::test {
namespace {

using shm::SlotCopyIn;
using shm::SlotStores;

std::vector<uint8_t> pattern(size_t n, uint8_t salt) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = uint8_t(i * 131 + salt);
  }
  return v;
}

}  // namespace

TEST_CASE("every slot store mode copies exactly the bytes asked for", "[copy_in]") {
  const SlotStores mode = GENERATE(SlotStores::kAuto, SlotStores::kCached, SlotStores::kStreaming);
  SlotCopyIn copier(mode);
  for (size_t bytes : {size_t(0), size_t(1), size_t(63), size_t(8191), size_t(8192), size_t(65537), size_t(1) << 20}) {
    for (size_t shift : {size_t(0), size_t(3)}) {
      INFO("mode " << int(mode) << ", " << bytes << " bytes, destination shifted by " << shift);
      const auto src = pattern(bytes + shift, uint8_t(bytes));
      std::vector<uint8_t> dst(bytes + 2 * shift + 64, 0xA5);
      copier.copy(dst.data() + shift, src.data() + shift, bytes);
      CHECK(std::memcmp(dst.data() + shift, src.data() + shift, bytes) == 0);
      for (size_t i = 0; i < shift; ++i) {
        CHECK(dst[i] == 0xA5);
      }
      for (size_t i = shift + bytes; i < dst.size(); ++i) {
        CHECK(dst[i] == 0xA5);
      }
    }
  }
}

TEST_CASE("auto: slow copies turn to streaming after the warm-up, and fast probes turn them back", "[copy_in]") {
  SlotCopyIn c(SlotStores::kAuto);
  const double slow = 30, fast = 5;
  for (uint32_t i = 1; i < SlotCopyIn::kWarmSamples; ++i) {
    c.record(slow);
    CHECK_FALSE(c.streaming());
  }
  c.record(slow);
  CHECK(c.streaming());
  CHECK(c.nsPerLine() == Approx(slow));
  // Back to cached only once the average is below the lower threshold, not as soon as one fast probe comes in.
  int probes = 0;
  while (c.streaming()) {
    c.record(fast);
    ++probes;
    REQUIRE(probes < 50);
  }
  CHECK(probes > 1);
  CHECK(c.nsPerLine() < SlotCopyIn::kCachedBelowNsPerLine);
}

TEST_CASE("auto: one copy stretched far beyond the rest does not flip the choice", "[copy_in]") {
  SlotCopyIn c(SlotStores::kAuto);
  for (uint32_t i = 0; i < 8; ++i) {
    c.record(7);
  }
  c.record(100000);  // an interrupt in the middle of a copy
  CHECK_FALSE(c.streaming());
  c.record(100000);  // but a second one in a row is a trend
  CHECK(c.streaming());
}

TEST_CASE("auto: small copies are never timed; while streaming, every kProbeEvery-th copy is a timed cached one",
          "[copy_in]") {
  SlotCopyIn c(SlotStores::kAuto);
  std::vector<uint8_t> src(SlotCopyIn::kTimedMinBytes, 1), dst(SlotCopyIn::kTimedMinBytes);
  for (int i = 0; i < 10; ++i) {
    c.copy(dst.data(), src.data(), SlotCopyIn::kTimedMinBytes - 1);
  }
  CHECK(c.samples() == 0);
  c.copy(dst.data(), src.data(), SlotCopyIn::kTimedMinBytes);
  CHECK(c.samples() == 1);
  for (uint32_t i = 1; i < SlotCopyIn::kWarmSamples; ++i) {
    c.record(1000);
  }
  REQUIRE(c.streaming());
  const uint32_t before = c.samples();
  for (uint32_t i = 1; i < SlotCopyIn::kProbeEvery; ++i) {
    c.copy(dst.data(), src.data(), SlotCopyIn::kTimedMinBytes);
  }
  CHECK(c.samples() == before);
  c.copy(dst.data(), src.data(), SlotCopyIn::kTimedMinBytes);
  CHECK(c.samples() == before + 1);
}

TEST_CASE("forced modes never time a copy", "[copy_in]") {
  const SlotStores mode = GENERATE(SlotStores::kCached, SlotStores::kStreaming);
  SlotCopyIn c(mode);
  std::vector<uint8_t> src(64 << 10, 1), dst(64 << 10);
  for (int i = 0; i < 100; ++i) {
    c.copy(dst.data(), src.data(), src.size());
  }
  CHECK(c.samples() == 0);
  CHECK(c.streaming() == (mode == SlotStores::kStreaming));
}

TEST_CASE("TUNEDIST_SLOT_STORES forces the slot stores, and a bad value names the variable", "[copy_in][options]") {
  CHECK(shm::ShmOptions{}.slotStores == SlotStores::kAuto);
  {
    ScopedEnv env("TUNEDIST_SLOT_STORES", "streaming");
    CHECK(shm::ShmOptions::fromEnv().slotStores == SlotStores::kStreaming);
  }
  {
    ScopedEnv env("TUNEDIST_SLOT_STORES", "cached");
    CHECK(shm::ShmOptions::fromEnv().slotStores == SlotStores::kCached);
  }
  {
    ScopedEnv env("TUNEDIST_SLOT_STORES", "auto");
    CHECK(shm::ShmOptions::fromEnv().slotStores == SlotStores::kAuto);
  }
  ScopedEnv env("TUNEDIST_SLOT_STORES", "fast");
  CHECK_THROWS_WITH(shm::ShmOptions::fromEnv(), Catch::Contains("TUNEDIST_SLOT_STORES") && Catch::Contains("fast"));
}

}  // namespace tunedist::test
