// Reduction and copy kernels of the engine. Three builds of the same source (portable, AVX2, AVX-512) are chosen at
// run time by CPU features; TUNEDIST_SIMD=scalar|avx2|avx512 or forceSimdLevel() pins one. Every level gives
// bit-identical results: reductions are element-wise, terms are combined in the fixed order srcs[0], srcs[1], ...,
// fp16/bf16 accumulate in fp32 and round once, and the build disables floating-point contraction (no FMA).
#pragma once

#include <cstddef>

#include "core/types.h"

namespace tunedist::shm {

enum class SimdLevel : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

const char* simdLevelName(SimdLevel level);
// The best level this CPU supports.
SimdLevel detectSimdLevel();
// The level in use: TUNEDIST_SIMD if set (read once), else forceSimdLevel's, else detectSimdLevel().
SimdLevel activeSimdLevel();
// Pins the level for this process; throws tunedist::Error if the CPU lacks it. Tests use it to compare levels.
void forceSimdLevel(SimdLevel level);
// Clears a forced level, back to TUNEDIST_SIMD or detection.
void resetSimdLevel();

struct ReduceArgs {
  DType dtype = DType::kFloat32;
  RedOp op = RedOp::kSum;
  // kPremulSum: every term is multiplied by `factor` before the sum.
  double factor = 1.0;
  // kAvg: the sum is divided by `divisor` (the world size). Integers divide truncating toward zero, as NCCL does.
  int divisor = 1;
};

// Throws tunedist::Error (naming op and dtype) for combinations without a meaning: bitwise ops on floating types,
// AVG/PREMUL_SUM on bool, PREMUL_SUM on integers.
void checkReduceSupported(DType dtype, RedOp op);

// out[i] = srcs[0][i] (op) srcs[1][i] (op) ... (op) srcs[nsrc-1][i], for i in [0, count), left to right.
// 1 <= nsrc <= 65536; nsrc == 1 copies (AVG still divides, PREMUL_SUM still multiplies). `out` may alias any of
// the srcs exactly (same pointer) but must not partially overlap one. Integer SUM/PRODUCT wrap around; integer
// PREMUL_SUM is refused (NCCL rounds the factor to the integer type; no single meaning is obvious).
void reduce(const ReduceArgs& args, void* out, const void* const* srcs, int nsrc, size_t count);

// The copy routine every collective uses (and the benchmark's memcpy_gbps measures). Tuned for a destination that
// another process reads next (a shared-memory slot): from 16 KiB up, the AVX2/AVX-512 levels write with
// non-temporal stores and end with an sfence, so a following release store publishes the data. dst == src is a
// no-op; otherwise the ranges must not overlap.
void copyBytes(void* dst, const void* src, size_t bytes);

// For a destination this process reads next (its own output tensor): plain memcpy, which leaves dst in this core's
// cache. On the dev machine it beats copyBytes 1.2-2x when the copying core reads dst next, and loses 2-3x when
// another core does (numbers in reduce_impl.h).
void copyBytesCached(void* dst, const void* src, size_t bytes);

}  // namespace tunedist::shm
