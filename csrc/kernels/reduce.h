// Reduction and copy kernels of the engine. Three builds of the same source (portable, AVX2, AVX-512) are chosen at
// run time by CPU features; TUNEDIST_SIMD=scalar|avx2|avx512 or forceSimdLevel() pins one. Every level gives
// bit-identical results: reductions are element-wise, terms are combined in the fixed order srcs[0], srcs[1], ...,
// fp16/bf16 accumulate in fp32 and round once, and the build disables floating-point contraction (no FMA).
#pragma once

#include <cstddef>

#include "core/types.h"

namespace tunedist::kernels {

enum class SimdLevel : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

const char* simdLevelName(SimdLevel level);
// The best level this CPU supports.
SimdLevel detectSimdLevel();
// The level in use: TUNEDIST_SIMD if set (read once), else forceSimdLevel's, else detectSimdLevel().
SimdLevel activeSimdLevel();
// Pins the level for this process; throws tunedist::core::Error if the CPU lacks it. Tests use it to compare levels.
void forceSimdLevel(SimdLevel level);
// Clears a forced level, back to TUNEDIST_SIMD or detection.
void resetSimdLevel();

struct ReduceArgs {
  core::DType dtype = core::DType::kFloat32;
  core::RedOp op = core::RedOp::kSum;
  // kPremulSum: every term is multiplied by `factor` before the sum.
  double factor = 1.0;
  // kAvg: the sum is divided by `divisor` (the world size). Integers divide truncating toward zero, as NCCL does.
  int divisor = 1;
};

// Throws tunedist::core::Error (naming op and dtype) for combinations without a meaning: bitwise ops on floating types,
// AVG/PREMUL_SUM on bool, PREMUL_SUM on integers.
void checkReduceSupported(core::DType dtype, core::RedOp op);

// out[i] = srcs[0][i] (op) srcs[1][i] (op) ... (op) srcs[nsrc-1][i], for i in [0, count), left to right.
// 1 <= nsrc <= 65536; nsrc == 1 copies (AVG still divides, PREMUL_SUM still multiplies). `out` may alias any of
// the srcs exactly (same pointer) but must not partially overlap one. Integer SUM/PRODUCT wrap around; integer
// PREMUL_SUM is refused (NCCL rounds the factor to the integer type; no single meaning is obvious).
void reduce(const ReduceArgs& args, void* out, const void* const* srcs, int nsrc, size_t count);

// Whether [a, a+bytes) and [b, b+bytes) share a byte.
bool rangesOverlap(const void* a, const void* b, size_t bytes);

// The streaming copy (and what the benchmark's memcpy_gbps measures): from 16 KiB up, the AVX2/AVX-512 levels write
// with non-temporal stores (no read-for-ownership of dst) and end with an sfence, so a following release store
// publishes the data. The collectives use it to copy out of a peer's slot into a user's tensor when a rank receives
// more than core::ShmOptions::cachedCopyMaxBytes in the operation (shm/rounds.h copyOut), except the two-shot
// all-reduce, whose chunks are one slot: cached there measured ~15% faster at 16 MiB. dst == src is a no-op; otherwise
// the ranges must not overlap.
void copyBytes(void* dst, const void* src, size_t bytes);

// Plain memcpy, which leaves dst in cache. The collectives use it to copy into their own slot, which peers read
// right away: end to end (tunedist.bench, 2 ranks of a 2-vCPU cloud VM) it made all_reduce 256 KiB 1.2-1.4x faster than
// the streaming copy (whose stores go to memory, where the peer then reads them), all_gather and reduce_scatter 1.3-2x
// from 64 KiB to 4 MiB; the isolated copy-then-read figures in reduce_impl.h had suggested the opposite.
void copyBytesCached(void* dst, const void* src, size_t bytes);

// One pass that copies src into both `shared` (our slot, which peers read next: streaming stores from 16 KiB when
// streamShared, as copyBytes, else cached) and `own` (our own block of an all_gather's output: streaming stores from
// 16 KiB when streamOwn and its address agrees with a streamed `shared`'s modulo 32, else cached), loading each line
// once. An out-of-place all_gather reads its input for both anyway; measured against the two copies (one process
// on a 2-vCPU AMD EPYC, AVX2, best of 7; docs/performance.md#store-placement-cached-or-streaming): cached 0.57-0.86 of
// their time, streaming to the slot 0.61-0.72 (0.53-0.65 in an unloaded run). The three ranges must not overlap.
void copyBytesTwice(void* shared, void* own, const void* src, size_t bytes, bool streamShared, bool streamOwn);

}  // namespace tunedist::kernels
