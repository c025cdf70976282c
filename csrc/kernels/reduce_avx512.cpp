// The AVX-512 (F, BW, VL) build of the kernels (CMake compiles *_avx512.cpp with -mavx512f -mavx512bw -mavx512vl
// -mavx512dq -mavx2 -mf16c -mno-fma -O3).
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__F16C__)
#error "reduce_avx512.cpp must be compiled with -mavx512f -mavx512bw -mavx512vl -mf16c (see CMakeLists.txt)"
#endif

#include "kernels/reduce_impl.h"

namespace tunedist::kernels::avx512 {

constexpr KernelTable kKernelTable = buildKernelTable();

}  // namespace tunedist::kernels::avx512
