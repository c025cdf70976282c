// fp16/bf16 compression kernels of the DDP comm hooks, at the SIMD level the reductions use (see reduce.h):
// one pass each, bit for bit what torch's fp16/bf16 compress hooks compute (NaNs: NaN-ness only).
#pragma once

#include <cstddef>

namespace tunedist::kernels {

enum class LowPrecision : int { kFloat16 = 0, kBFloat16 = 1 };

// out[i] = low(float(low(in[i])) / divisor) for `count` float32 inputs, as torch's `x.to(low).div_(divisor)`.
// `out` (count 16-bit elements) is either `in` itself (compression into the first half of its own bytes) or a
// buffer that does not overlap it. divisor >= 1.
void compressToLowPrecision(LowPrecision precision, void* out, const void* in, size_t count, int divisor);

// out[i] = float(in[i]) for `count` 16-bit inputs, as torch's `out.copy_(in)`. `out` (count floats) is either
// `in` itself (widening in place from the first half of its bytes) or a buffer that does not overlap it.
void widenFromLowPrecision(LowPrecision precision, void* out, const void* in, size_t count);

}  // namespace tunedist::kernels
