// Element conversions for the engine tests' expected values: every dtype to and from double, with fp16 and bf16
// rounded to nearest even here, independently of the engine's kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "core/types.h"

namespace tunedist::test {

using core::DType;

// fp16 and bf16 are made from a float: values that are not floats are first rounded to float, which is exact
// for every expected value the tests compare against.

inline uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float bitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Finite inputs only (the tests make no NaN); overflow gives infinity, as rounding to nearest does.
inline uint16_t halfBits(double v) {
  const uint32_t w = floatBits(float(v));
  const uint32_t sign = (w >> 16) & 0x8000u;
  const uint32_t a = w & 0x7fffffffu;
  uint32_t h = 0;
  if (a < 0x38800000u) {
    // Below 2^-14: a subnormal half, in units of 2^-24 (the product is exact; nearbyint rounds to even).
    h = uint32_t(std::nearbyint(bitsFloat(a) * 16777216.0f));
  } else {
    const uint32_t mant = a & 0x7fffffu;
    h = ((((a >> 23) - 127 + 15) << 10) | (mant >> 13));
    const uint32_t rest = mant & 0x1fffu;
    h += (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ? 1u : 0u;  // a carry moves into the exponent
    h = std::min(h, 0x7c00u);
  }
  return uint16_t(sign | h);
}

inline double halfValue(uint16_t b) {
  const uint32_t exp = (b >> 10) & 0x1fu;
  const uint32_t frac = b & 0x3ffu;
  const double mag = exp == 0    ? double(frac) / 16777216.0
                     : exp == 31 ? (frac == 0 ? HUGE_VAL : NAN)
                                 : double(bitsFloat(((exp + 112) << 23) | (frac << 13)));
  return (b & 0x8000u) ? -mag : mag;
}

inline uint16_t bf16Bits(double v) {
  const uint32_t w = floatBits(float(v));
  return uint16_t((w + 0x7fffu + ((w >> 16) & 1u)) >> 16);
}

inline double bf16Value(uint16_t b) { return bitsFloat(uint32_t(b) << 16); }

inline bool isSignedType(DType t) { return t != DType::kUInt8 && t != DType::kBool; }

// Element i of `base` as a double.
inline double loadValue(DType t, const void* base, size_t i) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(base)[i];
    case DType::kFloat64: return static_cast<const double*>(base)[i];
    case DType::kFloat16: return halfValue(static_cast<const uint16_t*>(base)[i]);
    case DType::kBFloat16: return bf16Value(static_cast<const uint16_t*>(base)[i]);
    case DType::kInt8: return static_cast<const int8_t*>(base)[i];
    case DType::kUInt8: return static_cast<const uint8_t*>(base)[i];
    case DType::kInt32: return static_cast<const int32_t*>(base)[i];
    case DType::kInt64: return double(static_cast<const int64_t*>(base)[i]);
    case DType::kBool: return static_cast<const uint8_t*>(base)[i];
  }
  throw core::Error("test: unknown dtype");
}

// Stores v (rounded to nearest for the floating types) as element i of `base`. With `exact`, throws unless the
// stored element reads back as v: expected values must be representable for exact comparisons.
inline void storeValue(DType t, void* base, size_t i, double v, bool exact = true) {
  switch (t) {
    case DType::kFloat32: static_cast<float*>(base)[i] = float(v); break;
    case DType::kFloat64: static_cast<double*>(base)[i] = v; break;
    case DType::kFloat16: static_cast<uint16_t*>(base)[i] = halfBits(v); break;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[i] = bf16Bits(v); break;
    case DType::kInt8: static_cast<int8_t*>(base)[i] = int8_t(v); break;
    case DType::kUInt8: static_cast<uint8_t*>(base)[i] = uint8_t(v); break;
    case DType::kInt32: static_cast<int32_t*>(base)[i] = int32_t(v); break;
    case DType::kInt64: static_cast<int64_t*>(base)[i] = int64_t(v); break;
    case DType::kBool: static_cast<uint8_t*>(base)[i] = v != 0 ? 1 : 0; break;
  }
  TD_CHECK(!exact || loadValue(t, base, i) == v || t == DType::kBool, "test: ", v, " is not exact in ",
           core::dtypeName(t));
}

}  // namespace tunedist::test
