// The size-dependent tunables: the one-shot limit per dtype and the cross-host pipeline chunk, their environment
// overrides and their bounds; the slot stores' environment override; the waiters' spin turns per group.
#include <catch2/catch.hpp>

#include <string>

#include "core/cpus.h"
#include "core/options.h"
#include "scoped_env.h"

namespace tunedist::test {
namespace {

constexpr size_t KiB = 1024;
constexpr size_t MiB = 1024 * KiB;

}  // namespace

TEST_CASE("the one-shot limit is smaller for 16-bit floats and never above a slot", "[options]") {
  using core::DType;
  core::ShmOptions o;
  CHECK(o.oneShotMaxBytesFor(DType::kFloat32) == 256 * KiB);
  CHECK(o.oneShotMaxBytesFor(DType::kFloat64) == 256 * KiB);
  CHECK(o.oneShotMaxBytesFor(DType::kInt32) == 256 * KiB);
  CHECK(o.oneShotMaxBytesFor(DType::kBFloat16) == 64 * KiB);
  CHECK(o.oneShotMaxBytesFor(DType::kFloat16) == 64 * KiB);
  // Tests that shrink oneShotMaxBytes shrink it for every dtype.
  o.oneShotMaxBytes = 1024;
  CHECK(o.oneShotMaxBytesFor(DType::kBFloat16) == 1024);
  CHECK(o.oneShotMaxBytesFor(DType::kFloat32) == 1024);
  // A slot bounds both.
  o.oneShotMaxBytes = 4 * MiB;
  o.halfOneShotMaxBytes = 4 * MiB;
  o.slotBytes = 64 * KiB;
  CHECK(o.oneShotMaxBytesFor(DType::kFloat32) == 64 * KiB);
  CHECK(o.oneShotMaxBytesFor(DType::kFloat16) == 64 * KiB);
}

TEST_CASE("TUNEDIST_ONESHOT_MAX_BYTES sets the one-shot limit of every dtype", "[options]") {
  ScopedEnv env("TUNEDIST_ONESHOT_MAX_BYTES", "524288");
  const auto o = core::ShmOptions::fromEnv();
  CHECK(o.oneShotMaxBytesFor(core::DType::kBFloat16) == 512 * KiB);
  CHECK(o.oneShotMaxBytesFor(core::DType::kFloat32) == 512 * KiB);
}

TEST_CASE("zero-copy is measured from 64 KiB unless TUNEDIST_SYMMETRIC_MIN_BYTES forces it", "[options]") {
  core::ShmOptions o;
  CHECK_FALSE(o.symmetricMinBytes.has_value());
  CHECK(o.zeroCopyMinBytes() == 64 * KiB);
  o.symmetricMinBytes = 0;
  CHECK(o.zeroCopyMinBytes() == 0);
  o.symmetricMinBytes = 64 * MiB;
  CHECK(o.zeroCopyMinBytes() == 64 * MiB);
}

TEST_CASE("TUNEDIST_CACHED_COPY_MAX_BYTES sets where the copy out of slots turns to streaming stores", "[options]") {
  CHECK(core::ShmOptions{}.cachedCopyMaxBytes == 2 * MiB);
  ScopedEnv env("TUNEDIST_CACHED_COPY_MAX_BYTES", "0");
  CHECK(core::ShmOptions::fromEnv().cachedCopyMaxBytes == 0);
}

TEST_CASE("TUNEDIST_BROADCAST_CACHED_COPY_MAX_BYTES sets where a broadcast's readers copy out with streaming stores",
          "[options]") {
  CHECK(core::ShmOptions{}.broadcastCachedCopyMaxBytes == 16 * MiB);
  ScopedEnv env("TUNEDIST_BROADCAST_CACHED_COPY_MAX_BYTES", "0");
  CHECK(core::ShmOptions::fromEnv().broadcastCachedCopyMaxBytes == 0);
}

TEST_CASE("TUNEDIST_BROADCAST_STREAM_BELOW_BYTES sets the broadcasts whose root streams into its slot", "[options]") {
  CHECK(core::ShmOptions{}.broadcastStreamBelowBytes == 512 * KiB);
  ScopedEnv env("TUNEDIST_BROADCAST_STREAM_BELOW_BYTES", "0");
  CHECK(core::ShmOptions::fromEnv().broadcastStreamBelowBytes == 0);
}

TEST_CASE("TUNEDIST_FUSED_OWN_COPY_MIN_BYTES sets the all_gather chunks copied in one pass", "[options]") {
  CHECK(core::ShmOptions{}.fusedOwnCopyMinBytes == 0);
  ScopedEnv env("TUNEDIST_FUSED_OWN_COPY_MIN_BYTES", "1048576");
  CHECK(core::ShmOptions::fromEnv().fusedOwnCopyMinBytes == 1 * MiB);
}

TEST_CASE("TUNEDIST_OWN_CACHED_COPY_MAX_BYTES sets where all_gather's own block streams", "[options]") {
  CHECK(core::ShmOptions{}.ownCachedCopyMaxBytes == core::ShmOptions{}.cachedCopyMaxBytes);
  ScopedEnv env("TUNEDIST_OWN_CACHED_COPY_MAX_BYTES", "0");
  CHECK(core::ShmOptions::fromEnv().ownCachedCopyMaxBytes == 0);
}

TEST_CASE("the cross-host chunk is a quarter of the call within 1-8 MiB unless set", "[options]") {
  core::CrossHostOptions o;
  CHECK(o.chunkBytesFor(0) == 1 * MiB);
  CHECK(o.chunkBytesFor(1 * MiB) == 1 * MiB);
  CHECK(o.chunkBytesFor(4 * MiB) == 1 * MiB);
  CHECK(o.chunkBytesFor(16 * MiB) == 4 * MiB);
  CHECK(o.chunkBytesFor(64 * MiB) == 8 * MiB);
  CHECK(o.chunkBytesFor(size_t(1) << 40) == 8 * MiB);
  o.chunkBytes = 4096;
  CHECK(o.chunkBytesFor(64 * MiB) == 4096);
}

TEST_CASE("TUNEDIST_CROSS_HOST_CHUNK_BYTES fixes the chunk and is checked", "[options]") {
  {
    ScopedEnv env("TUNEDIST_CROSS_HOST_CHUNK_BYTES", "2097152");
    CHECK(core::CrossHostOptions::fromEnv().chunkBytesFor(64 * MiB) == 2 * MiB);
  }
  {
    ScopedEnv env("TUNEDIST_CROSS_HOST_CHUNK_BYTES", "100");
    CHECK_THROWS_WITH(core::CrossHostOptions::fromEnv(),
                      Catch::Contains("TUNEDIST_CROSS_HOST_CHUNK_BYTES") && Catch::Contains("at least 4096"));
  }
}

TEST_CASE("TUNEDIST_SLOT_STORES forces the slot stores, and a bad value names the variable", "[options]") {
  using core::SlotStores;
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
  for (const char* bad : {"fast", "per-copy"}) {
    ScopedEnv env("TUNEDIST_SLOT_STORES", bad);
    CHECK_THROWS_WITH(core::ShmOptions::fromEnv(), Catch::Contains("TUNEDIST_SLOT_STORES") && Catch::Contains(bad) &&
                                                       Catch::Contains("auto, cached or streaming"));
  }
}

TEST_CASE("a group spins before yielding only where each of its ranks on this host has a CPU", "[options]") {
  const int cpus = core::usableCpus();
  REQUIRE(cpus >= 1);
  core::ShmOptions o;
  CHECK(o.spinIters == core::ShmOptions::kSpinItersAuto);
  CHECK(o.forRanks(1).spinIters == core::ShmOptions::kDefaultSpinIters);
  CHECK(o.forRanks(cpus).spinIters == core::ShmOptions::kDefaultSpinIters);
  CHECK(o.forRanks(cpus + 1).spinIters == 0);
  CHECK(o.forRanks(cpus + 1).slotBytes == o.slotBytes);
  // A small group of a job with more processes on the host than CPUs (LOCAL_WORLD_SIZE): no spin either.
  {
    ScopedEnv lws("LOCAL_WORLD_SIZE", std::to_string(cpus + 1).c_str());
    const auto job = core::ShmOptions::fromEnv();
    CHECK(job.localWorldSize == cpus + 1);
    CHECK(job.forRanks(1).spinIters == 0);
  }
  {
    ScopedEnv lws("LOCAL_WORLD_SIZE", "1");
    CHECK(core::ShmOptions::fromEnv().forRanks(1).spinIters == core::ShmOptions::kDefaultSpinIters);
  }
  // A value set (TUNEDIST_SPIN_ITERS) holds for every group size.
  ScopedEnv env("TUNEDIST_SPIN_ITERS", "250");
  const auto set = core::ShmOptions::fromEnv();
  CHECK(set.forRanks(1).spinIters == 250);
  CHECK(set.forRanks(cpus + 1).spinIters == 250);
  o.spinIters = -2;
  CHECK_THROWS_WITH(o.validate(), Catch::Contains("TUNEDIST_SPIN_ITERS"));
}

TEST_CASE("the usable CPUs are the affinity mask's, capped by a cgroup quota rounded up", "[options]") {
  CHECK(core::usableCpusFrom(64, 0, 0) == 64);           // no quota
  CHECK(core::usableCpusFrom(64, 200000, 100000) == 2);  // docker --cpus=2
  CHECK(core::usableCpusFrom(64, 150000, 100000) == 2);  // 1.5 CPUs: two can run at once
  CHECK(core::usableCpusFrom(64, 50000, 100000) == 1);
  CHECK(core::usableCpusFrom(2, 800000, 100000) == 2);  // the mask is the tighter bound
  CHECK(core::usableCpusFrom(0, -1, 100000) == 1);      // nothing known: at least one
}

}  // namespace tunedist::test
