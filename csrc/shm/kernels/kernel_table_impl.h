// The function table each SIMD level exports. reduce.cpp picks one table per call by the active level; the
// tables themselves are built from reduce_impl.h by reduce_{scalar,avx2,avx512}.cpp.
#pragma once

#include <cstddef>

#include "shm/kernels/reduce.h"
#include "shm/types.h"

namespace tunedist::shm::kernels {

constexpr int kNumRedOps = static_cast<int>(RedOp::kPremulSum) + 1;

// reduce() refuses more sources than this: the integer AVG kernels rely on sums below 2^53 (2^31 * 2^16 = 2^47).
constexpr int kMaxReduceSources = 1 << 16;

// Arguments are already validated by reduce(): nsrc >= 1, count >= 1, non-null pointers, supported combination.
using ReduceFn = void (*)(const ReduceArgs& args, void* out, const void* const* srcs, int nsrc, size_t count);
using CopyFn = void (*)(void* dst, const void* src, size_t bytes);

struct KernelTable {
  // nullptr where checkReduceSupported rejects the combination.
  ReduceFn reduce[kNumDTypes][kNumRedOps];
  CopyFn copy;
};

namespace scalar {
extern const KernelTable kKernelTable;
}
namespace avx2 {
extern const KernelTable kKernelTable;
}
namespace avx512 {
extern const KernelTable kKernelTable;
}

}  // namespace tunedist::shm::kernels
