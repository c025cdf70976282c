// The AVX2 + FMA build of the low-rank kernels (CMake compiles lowrank_avx2.cpp with -mavx2 -mfma
// -ffp-contract=off -O3; unlike the reductions, these kernels need not match the portable build bit for bit).
#if !defined(__AVX2__) || !defined(__FMA__)
#error "lowrank_avx2.cpp must be compiled with -mavx2 -mfma (CMakeLists.txt sets them)"
#endif

#include "kernels/lowrank_impl.h"

namespace tunedist::kernels::avx2 {

constexpr LowRankTable kLowRankTable = buildLowRankTable();

}  // namespace tunedist::kernels::avx2
