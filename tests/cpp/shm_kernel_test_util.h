// Helpers shared by the kernel tests (test_shm_kernels*.cpp): SIMD level selection for tests.
#pragma once

#include <catch2/catch.hpp>

#include <vector>

#include "core/error.h"
#include "kernels/reduce.h"

namespace tunedist::test {

// Restores the detected level when a test leaves, whatever it forced.
struct LevelReset {
  ~LevelReset() { shm::resetSimdLevel(); }
};

// The levels to compare: all this CPU supports, scalar first. TUNEDIST_SIMD outranks forceSimdLevel, so when
// it is set only its level is really tested.
inline std::vector<shm::SimdLevel> levelsToTest() {
  std::vector<shm::SimdLevel> levels;
  for (shm::SimdLevel l : {shm::SimdLevel::kScalar, shm::SimdLevel::kAvx2, shm::SimdLevel::kAvx512}) {
    try {
      shm::forceSimdLevel(l);
    } catch (const Error& e) {
      WARN("skipping SIMD level " << shm::simdLevelName(l) << ": " << e.what());
      continue;
    }
    if (shm::activeSimdLevel() != l) {
      WARN("TUNEDIST_SIMD pins the level; not testing " << shm::simdLevelName(l));
      continue;
    }
    levels.push_back(l);
  }
  shm::resetSimdLevel();
  return levels;
}

}  // namespace tunedist::test
