// The portable build of the low-rank kernels (CMake: -ffp-contract=off -O3, baseline x86-64, no FMA).
// GCC notes that 8-float vectors are passed differently without AVX; they never cross this file's boundary.
#pragma GCC diagnostic ignored "-Wpsabi"
#include "kernels/lowrank_impl.h"

namespace tunedist::kernels::scalar {

constexpr LowRankTable kLowRankTable = buildLowRankTable();

}  // namespace tunedist::kernels::scalar
