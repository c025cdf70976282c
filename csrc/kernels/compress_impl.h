// The compression kernels of the fp16/bf16 DDP comm hooks, compiled once per SIMD level with the reduction kernels
// (reduce_impl.h includes this header into every level's table). One pass each:
//   compress:   out[i] = low(widen(low(in[i])) / divisor)   -- torch's `buffer.to(low).div_(divisor)`: ATen's CPU
//               division of a reduced-precision tensor by a scalar widens to float, divides in float and rounds
//               back, so the value is rounded twice, as here (round to nearest even both times);
//   decompress: out[i] = widen(in[i])                        -- torch's `buffer.copy_(low)`, exact.
// `out` may be `in`'s own storage (compression into the first half of the float32 bucket, widening back from it).
// In place, the work is split into chunks whose input and output bytes are disjoint (forEachDoublingChunk), so no
// store clobbers input lanes not yet read. Distinct, non-overlapping buffers are one forward stream. NaNs stay NaNs
// (quiet, payload kept as F16C keeps it); torch's own NaN bits differ between its vectorised loop and its scalar tail,
// so only NaN-ness is comparable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels/convert_impl.h"

namespace tunedist::kernels {
namespace {

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

#if defined(__AVX2__)
// floatToBf16 on 8 lanes, the bf16 bits left in the low half of each 32-bit lane.
inline __m256i roundToBf16Lanes(__m256 f) {
  const __m256i w = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(w, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(w, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(w, 16), _mm256_set1_epi32(0x40));
  const __m256i isNan = _mm256_cmpgt_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x7FFFFFFF)),
                                           _mm256_set1_epi32(0x7F800000));
  return _mm256_blendv_epi8(rounded, nan, isNan);
}

// bf16(float(bf16(x)) / d) on 8 lanes, bits in the low halves.
inline __m256i compressBf16Lanes(__m256 x, __m256 d) {
  const __m256 low = _mm256_castsi256_ps(_mm256_slli_epi32(roundToBf16Lanes(x), 16));
  return roundToBf16Lanes(_mm256_div_ps(low, d));
}
#endif

inline void compressBf16Block(uint16_t* __restrict out, const float* __restrict in, size_t n, float divisor) {
  size_t i = 0;
#if defined(__AVX2__)
  const __m256 d = _mm256_set1_ps(divisor);
  for (; i + 16 <= n; i += 16) {
    const __m256i a = compressBf16Lanes(_mm256_loadu_ps(in + i), d);
    const __m256i b = compressBf16Lanes(_mm256_loadu_ps(in + i + 8), d);
    // packus works per 128-bit lane: a0-3 b0-3 a4-7 b4-7; the permute puts them in order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
  }
#endif
  for (; i < n; ++i) out[i] = floatToBf16(bf16ToFloat(floatToBf16(in[i])) / divisor);
}

// fp16 -> float for a block: F16C where the level has it, else the manual conversion. Also used by reduce_impl.h.
inline void widenHalfBlock(float* __restrict dst, const uint16_t* __restrict src, size_t n) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = halfToFloat(src[i]);
}

inline void widenBf16Into(float* __restrict out, const uint16_t* __restrict in, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16ToFloat(in[i]);
}

template <bool kIsHalf>
void compressRange(uint16_t* __restrict out, const float* __restrict in, size_t n, float divisor) {
  if constexpr (kIsHalf) {
    compressHalfBlock(out, in, n, divisor);
  } else {
    compressBf16Block(out, in, n, divisor);
  }
}

template <bool kIsHalf>
void widenRange(float* __restrict out, const uint16_t* __restrict in, size_t n) {
  if constexpr (kIsHalf) {
    widenHalfBlock(out, in, n);
  } else {
    widenBf16Into(out, in, n);
  }
}

// In place, elements [a, b) with b <= 2a read bytes [4a, 4b) as floats and write bytes [2a, 2b) as 16-bit values
// (or the reverse when widening): disjoint ranges. So after element 0 the chunks [1, 2), [2, 4), [4, 8), ...
// each run as one forward stream over non-aliasing pointers; compression walks the chunks upwards (a chunk only
// overwrites floats that earlier chunks have read), widening downwards. Element 0 goes through a register.
// (A backward walk in small blocks ran at half the speed of these forward streams: 3.7 vs 1.6 ms for 5M floats.)
template <typename Fn>
void forEachDoublingChunk(size_t count, bool upwards, Fn fn) {
  size_t bounds[8 * sizeof(size_t) + 1];
  size_t k = 0;
  for (size_t a = 1; a < count; a *= 2) bounds[k++] = a;
  bounds[k] = count;
  for (size_t j = 0; j < k; ++j) {
    const size_t c = upwards ? j : k - 1 - j;
    fn(bounds[c], bounds[c + 1] - bounds[c]);
  }
}

template <bool kIsHalf>
void compressKernel(void* out, const void* in, size_t count, float divisor) {
  auto* dst = static_cast<uint16_t*>(out);
  const auto* src = static_cast<const float*>(in);
  if (out != in) return compressRange<kIsHalf>(dst, src, count, divisor);
  float first = src[0];
  uint16_t firstOut;
  compressRange<kIsHalf>(&firstOut, &first, 1, divisor);
  forEachDoublingChunk(count, true, [&](size_t a, size_t n) { compressRange<kIsHalf>(dst + a, src + a, n, divisor); });
  dst[0] = firstOut;
}

template <bool kIsHalf>
void decompressKernel(void* out, const void* in, size_t count) {
  auto* dst = static_cast<float*>(out);
  const auto* src = static_cast<const uint16_t*>(in);
  if (out != in) return widenRange<kIsHalf>(dst, src, count);
  const uint16_t first = src[0];
  forEachDoublingChunk(count, false, [&](size_t a, size_t n) { widenRange<kIsHalf>(dst + a, src + a, n); });
  widenRange<kIsHalf>(dst, &first, 1);
}

}  // namespace
}  // namespace tunedist::kernels
