// The compression kernels of the fp16/bf16 DDP comm hooks, compiled once per SIMD level with the reduction kernels
// (reduce_impl.h includes this header into every level's table). One pass each:
//   compress:   out[i] = low(widen(low(in[i])) / divisor)   -- torch's `buffer.to(low).div_(divisor)`: ATen's CPU
//               division of a reduced-precision tensor by a scalar widens to float, divides in float and rounds
//               back, so the value is rounded twice, as here (round to nearest even both times);
//   decompress: out[i] = widen(in[i])                        -- torch's `buffer.copy_(low)`, exact.
// `out` may be `in`'s own storage (compression into the first half of the float32 bucket, widening back from it).
// Each block of input is first copied into an L1 buffer on the stack, so a block's stores never clobber input lanes
// that are not yet read: compression walks forward (output bytes [2a, 2b) lie below the unread input bytes from
// 4b on), widening walks backward (output bytes [4a, 4b) lie above the unread input bytes [0, 2a)). Distinct,
// non-overlapping buffers work too. NaNs stay NaNs (quiet, payload kept as F16C keeps it); torch's own NaN bits
// differ between its vectorised loop and its scalar tail, so only NaN-ness is comparable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "shm/kernels/convert_impl.h"

namespace tunedist::shm::kernels {
namespace {

// Elements per block: 4 KiB of floats, in L1 next to the output.
constexpr size_t kCompressBlock = 1024;

inline void compressHalfBlock(uint16_t* __restrict out, const float* __restrict in, size_t n, float divisor) {
  size_t i = 0;
#if defined(__F16C__)
  const __m256 d = _mm256_set1_ps(divisor);
  for (; i + 8 <= n; i += 8) {
    const __m128i low = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    const __m256 quotient = _mm256_div_ps(_mm256_cvtph_ps(low), d);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(quotient, _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  for (; i < n; ++i) out[i] = floatToHalf(halfToFloat(floatToHalf(in[i])) / divisor);
}

inline void compressBf16Block(uint16_t* __restrict out, const float* __restrict in, size_t n, float divisor) {
  for (size_t i = 0; i < n; ++i) out[i] = floatToBf16(bf16ToFloat(floatToBf16(in[i])) / divisor);
}

inline void widenHalfInto(float* __restrict out, const uint16_t* __restrict in, size_t n) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
#endif
  for (; i < n; ++i) out[i] = halfToFloat(in[i]);
}

inline void widenBf16Into(float* __restrict out, const uint16_t* __restrict in, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16ToFloat(in[i]);
}

template <bool kIsHalf>
void compressKernel(void* out, const void* in, size_t count, float divisor) {
  alignas(64) float block[kCompressBlock];
  auto* dst = static_cast<uint16_t*>(out);
  const auto* src = static_cast<const unsigned char*>(in);
  for (size_t base = 0; base < count; base += kCompressBlock) {
    const size_t n = count - base < kCompressBlock ? count - base : kCompressBlock;
    std::memcpy(block, src + base * sizeof(float), n * sizeof(float));
    if constexpr (kIsHalf) {
      compressHalfBlock(dst + base, block, n, divisor);
    } else {
      compressBf16Block(dst + base, block, n, divisor);
    }
  }
}

template <bool kIsHalf>
void decompressKernel(void* out, const void* in, size_t count) {
  alignas(64) uint16_t block[kCompressBlock];
  auto* dst = static_cast<float*>(out);
  const auto* src = static_cast<const unsigned char*>(in);
  for (size_t end = count; end > 0;) {
    const size_t n = end < kCompressBlock ? end : kCompressBlock;
    const size_t base = end - n;
    std::memcpy(block, src + base * sizeof(uint16_t), n * sizeof(uint16_t));
    if constexpr (kIsHalf) {
      widenHalfInto(dst + base, block, n);
    } else {
      widenBf16Into(dst + base, block, n);
    }
    end = base;
  }
}

}  // namespace
}  // namespace tunedist::shm::kernels
