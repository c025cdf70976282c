// The portable build of the kernels (baseline x86-64, i.e. SSE2 at most; CMake adds -O3 to *_scalar.cpp).
#include "kernels/reduce_impl.h"

namespace tunedist::kernels::scalar {

constexpr KernelTable kKernelTable = buildKernelTable();

}  // namespace tunedist::kernels::scalar
