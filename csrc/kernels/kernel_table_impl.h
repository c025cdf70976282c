// The function table each SIMD level exports. reduce.cpp picks one table per call by the active level; the
// tables themselves are built from reduce_impl.h by reduce_{scalar,avx2,avx512}.cpp.
#pragma once

#include <cstddef>

#include "core/types.h"
#include "kernels/reduce.h"

namespace tunedist::kernels {

constexpr int kNumRedOps = static_cast<int>(core::RedOp::kPremulSum) + 1;

// reduce() refuses more sources than this: the integer AVG kernels rely on sums below 2^53 (2^31 * 2^16 = 2^47).
constexpr int kMaxReduceSources = 1 << 16;

// Arguments are already validated by reduce(): nsrc >= 1, count >= 1, non-null pointers, supported combination.
using ReduceFn = void (*)(const ReduceArgs& args, void* out, const void* const* srcs, int nsrc, size_t count);
using CopyFn = void (*)(void* dst, const void* src, size_t bytes);
using CopyTwiceFn = void (*)(void* shared, void* own, const void* src, size_t bytes, bool streamShared, bool streamOwn);
// See compress_impl.h: fp32 -> fp16/bf16 with the division, and back; `out` may be `in`'s own storage.
using CompressFn = void (*)(void* out, const void* in, size_t count, float divisor);
using DecompressFn = void (*)(void* out, const void* in, size_t count);

struct KernelTable {
  // nullptr where checkReduceSupported rejects the combination.
  ReduceFn reduce[core::kNumDTypes][kNumRedOps];
  CopyFn copy;
  CopyTwiceFn copyTwice;
  // Index 0: float16, 1: bfloat16.
  CompressFn compress[2];
  DecompressFn decompress[2];
};

// The table of the active SIMD level (activeSimdLevel()).
const KernelTable& activeKernelTable();

namespace scalar {
extern const KernelTable kKernelTable;
}
namespace avx2 {
extern const KernelTable kKernelTable;
}
namespace avx512 {
extern const KernelTable kKernelTable;
}

}  // namespace tunedist::kernels
