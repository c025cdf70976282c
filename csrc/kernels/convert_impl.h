// Element conversions of the reduction kernels, written so the auto-vectoriser handles them: no branches (selects
// are bit masks, since GCC does not if-convert floating-point code under -ftrapping-math), memcpy for bit casts.
// Included by reduce_impl.h only; everything is in an anonymous namespace because every SIMD level's translation
// unit must keep its own copy, compiled with its own flags (an inline function with external linkage could be
// merged by the linker into the AVX-512 copy and then run on a CPU without AVX-512).
#pragma once

#include <cstdint>
#include <cstring>

namespace tunedist::kernels {
namespace {

inline float bitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline uint32_t floatToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// c ? a : b without a branch.
inline uint32_t selectBits(bool c, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return (a & mask) | (b & ~mask);
}

// IEEE binary16 -> binary32, exact. Normal halves are rebiased by a float multiply by 2^-112 (exact: a power of two,
// no overflow); subnormals go through 0.5 + m * 2^-24 - 0.5, which never touches a float denormal, so the result
// does not change under DAZ/FTZ. Inf stays Inf; NaN keeps its payload and gets the quiet bit, as VCVTPH2PS does.
// Checked bit for bit against F16C for all 65536 inputs.
inline float halfToFloat(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t twoW = w + w;
  const float normalized = bitsToFloat((twoW >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = bitsToFloat((twoW >> 17) | (126u << 23)) - 0.5f;
  const uint32_t magnitude = selectBits(twoW < (1u << 27), floatToBits(denormalized), floatToBits(normalized));
  return bitsToFloat(sign | magnitude);
}

// IEEE binary32 -> binary16, round to nearest even. The float add with a magic bias rounds the mantissa to the
// half's precision (subnormal halves included); overflow becomes Inf through the float multiply. NaN keeps the top
// payload bits with the quiet bit set, as VCVTPS2PH does. Checked bit for bit against F16C for all 2^32 inputs.
inline uint16_t floatToHalf(float f) {
  const uint32_t w = floatToBits(f);
  const uint32_t twoW = w + w;
  const uint32_t sign = w & 0x80000000u;
  float base = (bitsToFloat(twoW >> 1) * 0x1.0p+112f) * 0x1.0p-110f;
  uint32_t bias = twoW & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = bitsToFloat((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = floatToBits(base);
  const uint32_t nonNan = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
  const uint32_t nan = 0x7E00u | ((w >> 13) & 0x3FFu);
  return static_cast<uint16_t>((sign >> 16) | selectBits(twoW > 0xFF000000u, nan, nonNan));
}

inline float bf16ToFloat(uint16_t b) { return bitsToFloat(static_cast<uint32_t>(b) << 16); }

// binary32 -> bfloat16, round to nearest even; NaN keeps its top payload bits and gets the quiet bit (a plain
// rounding add could carry a NaN into Inf).
inline uint16_t floatToBf16(float f) {
  const uint32_t w = floatToBits(f);
  const uint32_t rounded = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;
  const uint32_t nan = (w >> 16) | 0x40u;
  return static_cast<uint16_t>(selectBits((w & 0x7FFFFFFFu) > 0x7F800000u, nan, rounded));
}

// Storage/accumulator pairs. widen() turns a stored element into the accumulator type, narrow() stores back.

// Same-kind conversions: float, double, and integers accumulated in their unsigned twin (wrap-around without UB)
// or in themselves (MIN/MAX). Integer narrowing is modular (GCC defines it so; C++20 requires it).
template <typename S, typename A>
struct PlainCodec {
  using Storage = S;
  using Acc = A;
  static constexpr bool kHalf = false;
  static A widen(S s) { return static_cast<A>(s); }
  static S narrow(A a) { return static_cast<S>(a); }
};

// IEEE half in uint16_t storage, accumulated in float.
struct HalfCodec {
  using Storage = uint16_t;
  using Acc = float;
  // Lets the kernel use F16C block conversions where the level has them.
  static constexpr bool kHalf = true;
  static float widen(uint16_t s) { return halfToFloat(s); }
  static uint16_t narrow(float a) { return floatToHalf(a); }
};

struct BFloat16Codec {
  using Storage = uint16_t;
  using Acc = float;
  static constexpr bool kHalf = false;
  static float widen(uint16_t s) { return bf16ToFloat(s); }
  static uint16_t narrow(float a) { return floatToBf16(a); }
};

// One byte per bool; any non-zero byte reads as true, results are always 0 or 1.
struct BoolCodec {
  using Storage = uint8_t;
  using Acc = uint8_t;
  static constexpr bool kHalf = false;
  static uint8_t widen(uint8_t s) { return static_cast<uint8_t>(s != 0); }
  static uint8_t narrow(uint8_t a) { return a; }
};

// AVG of 8- and 32-bit integers, summed in A = float (8-bit) or double (32-bit). With at most kMaxReduceSources
// terms the sum is exact (|sum| <= 2^8 * 2^16 < 2^24, or 2^31 * 2^16 < 2^53), and truncating the correctly rounded
// quotient then gives exactly the truncated integer quotient: rounding up to the next integer would need
// sum/divisor within 2^-p * |sum/divisor| of it, but it is at least 1/divisor away. narrow() truncates toward
// zero. This vectorises (through int32 for 8-bit types); a 64-bit integer division per element ran at 0.8 GB/s.
template <typename S, typename A>
struct SmallIntAvgCodec {
  static_assert(sizeof(S) == 1 || (sizeof(S) == 4 && sizeof(A) == 8), "sum must be exact in the accumulator");
  using Storage = S;
  using Acc = A;
  static constexpr bool kHalf = false;
  static A widen(S s) { return static_cast<A>(s); }
  static S narrow(A a) {
    // An 8-bit average fits int32 (|a| < 2^24); a 32-bit one need not when divisor < nsrc, so go through int64.
    if constexpr (sizeof(S) == 1) {
      return static_cast<S>(static_cast<int32_t>(a));
    } else {
      return static_cast<S>(static_cast<int64_t>(a));
    }
  }
};

// AVG of int64: sum in uint64 (wrapping instead of overflowing), then AvgOp divides as int64.
struct Int64AvgCodec {
  using Storage = int64_t;
  using Acc = uint64_t;
  static constexpr bool kHalf = false;
  static uint64_t widen(int64_t s) { return static_cast<uint64_t>(s); }
  static int64_t narrow(uint64_t a) { return static_cast<int64_t>(a); }
};

}  // namespace
}  // namespace tunedist::kernels
