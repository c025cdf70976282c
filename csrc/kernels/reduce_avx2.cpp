// The AVX2 + F16C build of the kernels (CMake compiles *_avx2.cpp with -mavx2 -mf16c -mno-fma -O3).
#if !defined(__AVX2__) || !defined(__F16C__)
#error "reduce_avx2.cpp must be compiled with -mavx2 -mf16c (CMakeLists.txt sets them for *_avx2.cpp)"
#endif

#include "kernels/reduce_impl.h"

namespace tunedist::kernels::avx2 {

constexpr KernelTable kKernelTable = buildKernelTable();

}  // namespace tunedist::kernels::avx2
