// The SIMD level switch (forceSimdLevel, TUNEDIST_SIMD) and the copy routines, at every level this CPU has.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/reduce.h"
#include "shm_kernel_test_util.h"

extern char** environ;

namespace {

using tunedist::kernels::ReduceArgs;
using tunedist::kernels::SimdLevel;
using tunedist::test::LevelReset;
using tunedist::test::levelsToTest;
using Bytes = std::vector<uint8_t>;
namespace kernels = tunedist::kernels;

// Written after the output to catch stores past the end.
constexpr uint8_t kGuard = 0xA5;
constexpr size_t kGuardBytes = 64;

}  // namespace

TEST_CASE("forcing a level the CPU lacks throws", "[shm][kernels]") {
  using Catch::Matchers::Contains;
  LevelReset reset;
  const SimdLevel best = kernels::detectSimdLevel();
  bool anyMissing = false;
  for (SimdLevel l : {SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (static_cast<int>(l) <= static_cast<int>(best)) continue;
    anyMissing = true;
    CHECK_THROWS_WITH(kernels::forceSimdLevel(l),
                      Contains(kernels::simdLevelName(l)) && Contains(kernels::simdLevelName(best)));
  }
  if (!anyMissing) WARN("this CPU has every SIMD level; nothing unsupported to force");
  CHECK_THROWS_AS(kernels::forceSimdLevel(static_cast<SimdLevel>(7)), tunedist::core::Error);
  CHECK_NOTHROW(kernels::forceSimdLevel(SimdLevel::kScalar));
}

// Run by the test below in a child process, because TUNEDIST_SIMD is read once per process. Hidden ("[.]").
TEST_CASE("TUNEDIST_SIMD child", "[.][simd-env-child]") {
  using Catch::Matchers::Contains;
  const std::string env = std::getenv("TUNEDIST_SIMD") ? std::getenv("TUNEDIST_SIMD") : "";
  const std::string expect = std::getenv("TUNEDIST_EXPECT") ? std::getenv("TUNEDIST_EXPECT") : "";
  if (expect.empty()) {
    CHECK_THROWS_WITH(kernels::activeSimdLevel(), Contains("TUNEDIST_SIMD=" + env));
    float x = 1;
    const void* srcs[] = {&x};
    CHECK_THROWS_WITH(kernels::reduce(ReduceArgs{}, &x, srcs, 1, 1), Contains("TUNEDIST_SIMD=" + env));
  } else {
    kernels::forceSimdLevel(SimdLevel::kScalar);  // the environment outranks forceSimdLevel
    CHECK(kernels::simdLevelName(kernels::activeSimdLevel()) == expect);
    kernels::resetSimdLevel();
  }
}

TEST_CASE("TUNEDIST_SIMD pins the level and rejects bad values", "[shm][kernels]") {
  const auto runChild = [](const std::string& simd, const std::string& expect) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      if (std::strncmp(*e, "TUNEDIST_", 9) != 0) env.emplace_back(*e);
    }
    env.push_back("TUNEDIST_SIMD=" + simd);
    if (!expect.empty()) env.push_back("TUNEDIST_EXPECT=" + expect);
    std::vector<char*> envp, argv;
    for (std::string& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string self = "/proc/self/exe", spec = "[simd-env-child]";
    argv = {self.data(), spec.data(), nullptr};
    // The child's report goes to a file, shown only if it failed.
    char logPath[] = "/tmp/tunedist_simd_env_XXXXXX";
    const int logFd = mkstemp(logPath);
    REQUIRE(logFd >= 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, logFd, 1);
    posix_spawn_file_actions_adddup2(&actions, logFd, 2);
    pid_t pid;
    const int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    int status = 0;
    if (rc == 0) waitpid(pid, &status, 0);
    std::string log(1 << 14, '\0');
    log.resize(std::max<ssize_t>(0, pread(logFd, log.data(), log.size(), 0)));
    close(logFd);
    unlink(logPath);
    REQUIRE(rc == 0);
    INFO("child with TUNEDIST_SIMD=" << simd << " printed:\n" << log);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  };
  runChild("bogus", "");
  runChild("scalar", "scalar");
  const SimdLevel best = kernels::detectSimdLevel();
  runChild(kernels::simdLevelName(best), kernels::simdLevelName(best));
  if (best != SimdLevel::kAvx512) runChild("avx512", "");  // asks for a level this CPU lacks
}

TEST_CASE("copyBytesTwice copies exactly into both destinations, at every level and store mode of each",
          "[shm][kernels]") {
  LevelReset reset;
  std::mt19937 rng(11);
  Bytes src((1 << 20) + 256);
  for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
  auto intact = [](const Bytes& d, size_t off, size_t bytes) {
    bool ok = true;
    for (size_t g = 0; g < off; ++g) ok &= d[g] == kGuard;
    for (size_t g = bytes + off; g < d.size(); ++g) ok &= d[g] == kGuard;
    return ok;
  };
  for (SimdLevel l : levelsToTest()) {
    kernels::forceSimdLevel(l);
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{16383}, size_t{16384},
                         size_t{16384 + 17}, size_t{(1 << 20) + 3}}) {
      for (size_t srcOff : {0, 3}) {
        for (size_t sharedOff : {0, 1, 63}) {
          for (size_t ownOff : {0, 5}) {
            for (int stores = 0; stores < 4; ++stores) {
              // Each destination cached or streaming; both streaming with own+5 and shared+0/63 leaves own cached.
              const bool stream = (stores & 1) != 0, streamOwn = (stores & 2) != 0;
              Bytes shared(bytes + sharedOff + kGuardBytes, kGuard), own(bytes + ownOff + kGuardBytes, kGuard);
              kernels::copyBytesTwice(shared.data() + sharedOff, own.data() + ownOff, src.data() + srcOff, bytes,
                                      stream, streamOwn);
              INFO("level " << kernels::simdLevelName(l) << " bytes " << bytes << " src+" << srcOff << " shared+"
                            << sharedOff << " own+" << ownOff << (stream ? " slot streaming" : " slot cached")
                            << (streamOwn ? ", own streaming" : ", own cached"));
              CHECK(std::memcmp(shared.data() + sharedOff, src.data() + srcOff, bytes) == 0);
              CHECK(std::memcmp(own.data() + ownOff, src.data() + srcOff, bytes) == 0);
              CHECK(intact(shared, sharedOff, bytes));
              CHECK(intact(own, ownOff, bytes));
            }
          }
        }
      }
    }
  }
  // Both destinations streaming needs their addresses to agree modulo 32: from 64-byte aligned buffers, offsets
  // that agree (0/0, 1/33, 63/31) take that path, and the copies are still exact.
  for (SimdLevel l : levelsToTest()) {
    kernels::forceSimdLevel(l);
    for (auto [sharedOff, ownOff] : {std::pair<size_t, size_t>{0, 0}, {1, 33}, {63, 31}}) {
      const size_t bytes = (1 << 16) + 77;
      alignas(64) static uint8_t shared[(1 << 16) + 256], own[(1 << 16) + 256];
      std::memset(shared, kGuard, sizeof shared);
      std::memset(own, kGuard, sizeof own);
      kernels::copyBytesTwice(shared + sharedOff, own + ownOff, src.data(), bytes, true, true);
      INFO("level " << kernels::simdLevelName(l) << " shared+" << sharedOff << " own+" << ownOff);
      CHECK(std::memcmp(shared + sharedOff, src.data(), bytes) == 0);
      CHECK(std::memcmp(own + ownOff, src.data(), bytes) == 0);
      CHECK(intact(Bytes(shared, shared + sizeof shared), sharedOff, bytes));
      CHECK(intact(Bytes(own, own + sizeof own), ownOff, bytes));
    }
  }
  // Overlapping ranges are refused, not half-copied.
  Bytes buf(4096, kGuard);
  CHECK_THROWS_WITH(kernels::copyBytesTwice(buf.data(), buf.data() + 1024, buf.data() + 100, 2048, false, false),
                    Catch::Matchers::Contains("must not overlap"));
}

TEST_CASE("copyBytes and copyBytesCached copy exactly, at every level", "[shm][kernels]") {
  LevelReset reset;
  std::mt19937 rng(7);
  Bytes src((1 << 20) + 256);
  for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
  for (SimdLevel l : levelsToTest()) {
    kernels::forceSimdLevel(l);
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{4095}, size_t{16383}, size_t{16384},
                         size_t{16384 + 17}, size_t{(1 << 20) + 3}}) {
      for (size_t srcOff : {0, 3}) {
        for (size_t dstOff : {0, 1, 31, 63}) {
          for (bool cached : {false, true}) {
            Bytes dst(bytes + dstOff + kGuardBytes, kGuard);
            (cached ? kernels::copyBytesCached : kernels::copyBytes)(dst.data() + dstOff, src.data() + srcOff, bytes);
            INFO("level " << kernels::simdLevelName(l) << " bytes " << bytes << " src+" << srcOff << " dst+" << dstOff
                          << (cached ? " cached" : " streaming"));
            CHECK(std::memcmp(dst.data() + dstOff, src.data() + srcOff, bytes) == 0);
            bool guardsIntact = true;
            for (size_t g = 0; g < dstOff; ++g) guardsIntact &= dst[g] == kGuard;
            for (size_t g = bytes + dstOff; g < dst.size(); ++g) guardsIntact &= dst[g] == kGuard;
            CHECK(guardsIntact);
          }
        }
      }
    }
  }
}
