// Helpers shared by the kernel tests (test_shm_kernels*.cpp): SIMD level selection for tests.
#pragma once

#include <catch2/catch.hpp>

#include <vector>

#include "core/error.h"
#include "kernels/reduce.h"

namespace tunedist::test {

// Restores the detected level when a test leaves, whatever it forced.
struct LevelReset {
  ~LevelReset() { kernels::resetSimdLevel(); }
};

// The levels to compare: all this CPU supports, scalar first. TUNEDIST_SIMD outranks forceSimdLevel, so when
// it is set only its level is really tested.
inline std::vector<kernels::SimdLevel> levelsToTest() {
  std::vector<kernels::SimdLevel> levels;
  for (kernels::SimdLevel l : {kernels::SimdLevel::kScalar, kernels::SimdLevel::kAvx2, kernels::SimdLevel::kAvx512}) {
    try {
      kernels::forceSimdLevel(l);
    } catch (const core::Error& e) {
      WARN("skipping SIMD level " << kernels::simdLevelName(l) << ": " << e.what());
      continue;
    }
    if (kernels::activeSimdLevel() != l) {
      WARN("TUNEDIST_SIMD pins the level; not testing " << kernels::simdLevelName(l));
      continue;
    }
    levels.push_back(l);
  }
  kernels::resetSimdLevel();
  return levels;
}

}  // namespace tunedist::test
