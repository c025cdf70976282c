// Reduction and copy kernels: every dtype x op x nsrc x count against a closed-form reference, at every SIMD level
// this CPU has, plus aliasing, single rounding of fp16/bf16, NaN propagation and the error paths.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/reduce.h"
#include "shm_kernel_test_util.h"

namespace {

using tunedist::core::DType;
using tunedist::core::RedOp;
using tunedist::kernels::ReduceArgs;
using tunedist::kernels::SimdLevel;
using Bytes = std::vector<uint8_t>;
namespace core = tunedist::core;
namespace kernels = tunedist::kernels;
using tunedist::test::LevelReset;
using tunedist::test::levelsToTest;

constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kInt8,
                             DType::kUInt8,   DType::kInt32,   DType::kInt64,   DType::kBool};
constexpr RedOp kOps[] = {RedOp::kSum,  RedOp::kAvg, RedOp::kProduct, RedOp::kMin,      RedOp::kMax,
                          RedOp::kBand, RedOp::kBor, RedOp::kBxor,    RedOp::kPremulSum};
constexpr int kNsrcs[] = {1, 2, 3, 4, 8};
constexpr size_t kCounts[] = {0, 1, 7, 63, 1000, 4097};
constexpr size_t kNone = SIZE_MAX;
// Written after the output to catch stores past `count`.
constexpr uint8_t kGuard = 0xA5;
constexpr size_t kGuardBytes = 64;

bool supported(DType d, RedOp op) {
  try {
    kernels::checkReduceSupported(d, op);
    return true;
  } catch (const tunedist::core::Error&) {
    return false;
  }
}

// ---- Element encodings used by the reference (independent of the kernels' conversion code). ----

uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
// Round to nearest even, written the obvious way.
uint16_t refBf16(float f) {
  if (std::isnan(f)) return static_cast<uint16_t>((floatBits(f) >> 16) | 0x40);
  const uint32_t b = floatBits(f), low = b & 0xFFFF;
  uint32_t high = b >> 16;
  if (low > 0x8000 || (low == 0x8000 && (high & 1))) ++high;
  return static_cast<uint16_t>(high);
}
// libgcc's soft-float conversion, a second implementation to check ours against.
uint16_t refHalf(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
float halfValue(uint16_t u) {  // exact
  _Float16 h;
  std::memcpy(&h, &u, 2);
  return static_cast<float>(h);
}
float bf16Value(uint16_t u) {
  const uint32_t b = static_cast<uint32_t>(u) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

template <typename T>
void put(Bytes& buf, size_t i, T v) {
  std::memcpy(buf.data() + i * sizeof(T), &v, sizeof(T));
}
template <typename T>
T get(const Bytes& buf, size_t i) {
  T v;
  std::memcpy(&v, buf.data() + i * sizeof(T), sizeof(T));
  return v;
}

// Stores a value of the accumulator type (float for 16-bit types) as `d`, rounding once.
void putFloat(DType d, Bytes& buf, size_t i, double v) {
  switch (d) {
    case DType::kFloat32: return put(buf, i, static_cast<float>(v));
    case DType::kFloat64: return put(buf, i, v);
    case DType::kFloat16: return put(buf, i, refHalf(static_cast<float>(v)));
    case DType::kBFloat16: return put(buf, i, refBf16(static_cast<float>(v)));
    default: FAIL("not a floating dtype");
  }
}

uint64_t mix(int rank, size_t i) {
  uint64_t x = (static_cast<uint64_t>(rank) + 1) * 0x9E3779B97F4A7C15ull ^ (i + 1) * 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 29);
}

// Float inputs: halves in [-4, 4] (sums of 8 are exact in every float dtype); for PRODUCT, powers of two and 0, so
// products of 8 are exact too.
double floatInput(RedOp op, int rank, size_t i) {
  static const double kProductSet[] = {-2, -1, -0.5, 0.5, 1, 2, 0};
  if (op == RedOp::kProduct) return kProductSet[mix(rank, i) % 7];
  return (static_cast<int>(mix(rank, i) % 17) - 8) * 0.5;
}

// Exact in double for the inputs above; AVG's quotient rounds once to float (or stays double), then to the dtype.
double floatExpected(DType d, const ReduceArgs& a, const std::vector<double>& t) {
  double r = t[0];
  for (size_t k = 1; k < t.size(); ++k) {
    switch (a.op) {
      case RedOp::kProduct: r *= t[k]; break;
      case RedOp::kMin: r = std::min(r, t[k]); break;
      case RedOp::kMax: r = std::max(r, t[k]); break;
      default: r += t[k]; break;
    }
  }
  if (a.op == RedOp::kPremulSum) r *= a.factor;  // factor is a power of two: exact
  if (a.op == RedOp::kAvg) r = d == DType::kFloat64 ? r / a.divisor : static_cast<float>(r) / a.divisor;
  return r;
}

template <typename T>
T intExpected(const ReduceArgs& a, const std::vector<T>& t) {
  using U = std::make_unsigned_t<T>;
  uint64_t r = static_cast<U>(t[0]);  // bit patterns for the wrapping and bitwise ops
  int64_t sum = t[0];
  T m = t[0];
  for (size_t k = 1; k < t.size(); ++k) {
    const uint64_t u = static_cast<U>(t[k]);
    switch (a.op) {
      case RedOp::kSum: r += u; break;
      case RedOp::kProduct: r *= u; break;
      case RedOp::kBand: r &= u; break;
      case RedOp::kBor: r |= u; break;
      case RedOp::kBxor: r ^= u; break;
      case RedOp::kMin: m = std::min(m, t[k]); break;
      case RedOp::kMax: m = std::max(m, t[k]); break;
      default: sum = static_cast<int64_t>(static_cast<uint64_t>(sum) + static_cast<uint64_t>(int64_t{t[k]})); break;
    }
  }
  if (a.op == RedOp::kMin || a.op == RedOp::kMax) return m;
  if (a.op == RedOp::kAvg) return static_cast<T>(sum / a.divisor);
  return static_cast<T>(r);
}

template <typename T>
void fillInt(const ReduceArgs& a, std::vector<Bytes>& in, Bytes& expected, size_t count) {
  std::vector<T> terms(in.size());
  for (size_t i = 0; i < count; ++i) {
    for (size_t r = 0; r < in.size(); ++r) {
      terms[r] = static_cast<T>(mix(static_cast<int>(r), i) >> 7);
      put(in[r], i, terms[r]);
    }
    put(expected, i, intExpected(a, terms));
  }
}

// Inputs for every source and the expected output, from closed forms of (rank, index).
void makeCase(const ReduceArgs& a, int nsrc, size_t count, std::vector<Bytes>& in, Bytes& expected) {
  const size_t elem = core::dtypeSize(a.dtype);
  in.assign(nsrc, Bytes(count * elem));
  expected.assign(count * elem, 0);
  switch (a.dtype) {
    case DType::kInt8: return fillInt<int8_t>(a, in, expected, count);
    case DType::kUInt8: return fillInt<uint8_t>(a, in, expected, count);
    case DType::kInt32: return fillInt<int32_t>(a, in, expected, count);
    case DType::kInt64: return fillInt<int64_t>(a, in, expected, count);
    case DType::kBool:
      for (size_t i = 0; i < count; ++i) {
        bool any = false, all = true, parity = false;
        for (int r = 0; r < nsrc; ++r) {
          const uint64_t m = mix(r, i);
          // Mostly 0/1, sometimes another non-zero byte, which must read as true.
          const uint8_t v = m % 3 == 0 ? 0 : (m % 7 == 0 ? 2 : 1);
          in[r][i] = v;
          any |= v != 0, all &= v != 0, parity ^= v != 0;
        }
        const bool orOp = a.op == RedOp::kSum || a.op == RedOp::kMax || a.op == RedOp::kBor;
        expected[i] = a.op == RedOp::kBxor ? parity : orOp ? any : all;
      }
      return;
    default:
      std::vector<double> terms(nsrc);
      for (size_t i = 0; i < count; ++i) {
        for (int r = 0; r < nsrc; ++r) {
          terms[r] = floatInput(a.op, r, i);
          putFloat(a.dtype, in[r], i, terms[r]);
        }
        putFloat(a.dtype, expected, i, floatExpected(a.dtype, a, terms));
      }
  }
}

// Runs reduce on copies of `in`; alias < 0 writes a separate buffer, else out == srcs[alias]. With `shift`, every
// buffer starts one element past the allocation's (16-byte) alignment, as a tensor view may.
Bytes runReduce(const ReduceArgs& a, const std::vector<Bytes>& in, int alias, size_t count, bool shift = false) {
  const size_t elem = core::dtypeSize(a.dtype), bytes = count * elem, pre = shift ? elem : 0;
  std::vector<Bytes> bufs(in);
  for (Bytes& b : bufs) {
    b.insert(b.begin(), pre, kGuard);
    b.resize(pre + bytes + kGuardBytes, kGuard);
  }
  Bytes separate(pre + bytes + kGuardBytes, kGuard);
  std::vector<const void*> srcs;
  for (Bytes& b : bufs) srcs.push_back(b.data() + pre);
  Bytes& out = alias < 0 ? separate : bufs[alias];
  kernels::reduce(a, out.data() + pre, srcs.data(), static_cast<int>(srcs.size()), count);
  for (size_t g = 0; g < pre; ++g) REQUIRE(out[g] == kGuard);
  for (size_t g = pre + bytes; g < out.size(); ++g) REQUIRE(out[g] == kGuard);
  return Bytes(out.begin() + pre, out.begin() + pre + bytes);
}

size_t firstMismatch(const Bytes& x, const Bytes& y, size_t elem) {
  for (size_t i = 0; i < x.size(); i += elem) {
    if (std::memcmp(x.data() + i, y.data() + i, elem) != 0) return i / elem;
  }
  return kNone;
}

std::string hexElem(const Bytes& b, size_t i, size_t elem) {
  std::ostringstream os;
  os << "0x";
  for (size_t k = elem; k-- > 0;) os << std::hex << std::setw(2) << std::setfill('0') << int(b[i * elem + k]);
  return os.str();
}

// One CHECK per comparison (not per element) keeps the matrix fast; INFO names everything needed to reproduce.
void checkSame(const std::string& what, const Bytes& expected, const Bytes& actual, DType d) {
  const size_t elem = core::dtypeSize(d);
  REQUIRE(expected.size() == actual.size());
  const size_t bad = firstMismatch(expected, actual, elem);
  if (bad == kNone) return;
  INFO(what << " index " << bad << ": expected " << hexElem(expected, bad, elem) << " got "
            << hexElem(actual, bad, elem));
  CHECK(bad == kNone);
}

std::string describe(const ReduceArgs& a, int nsrc, size_t count, SimdLevel l, int alias) {
  std::ostringstream os;
  os << "dtype " << core::dtypeName(a.dtype) << " op " << core::redOpName(a.op) << " nsrc " << nsrc << " count "
     << count << " level " << kernels::simdLevelName(l) << " out ";
  if (alias < 0) {
    os << "separate";
  } else {
    os << "== srcs[" << alias << "]";
  }
  return os.str();
}

}  // namespace

TEST_CASE("reduce matches the closed-form reference at every SIMD level", "[shm][kernels]") {
  LevelReset reset;
  const std::vector<SimdLevel> levels = levelsToTest();
  std::vector<Bytes> in;
  Bytes expected;
  for (DType d : kDTypes) {
    for (RedOp op : kOps) {
      if (!supported(d, op)) continue;
      for (int nsrc : kNsrcs) {
        for (size_t count : kCounts) {
          ReduceArgs a;
          // divisor nsrc-1, nsrc or nsrc+1 (at least 1): AVG truncation and out-of-range averages both show up.
          a.dtype = d, a.op = op, a.factor = 0.25, a.divisor = std::max(1, nsrc - 1 + static_cast<int>(count % 3));
          makeCase(a, nsrc, count, in, expected);
          for (SimdLevel l : levels) {
            kernels::forceSimdLevel(l);
            for (int alias : {-1, 0, nsrc - 1}) {
              const bool shift = count % 2 == 1;
              INFO("buffers " << (shift ? "shifted by one element" : "16-byte aligned"));
              checkSame(describe(a, nsrc, count, l, alias), expected, runReduce(a, in, alias, count, shift), d);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("fp16 and bf16 accumulate in fp32 and round once", "[shm][kernels]") {
  // x + u/2 (u = ulp(x)) is a tie that rounds back to x after each pairwise step, but x + u/2 + u/2 = x + u is
  // exact. x = +-2^k over 165 elements covers every loop of the in-register sum at every level: 4 registers a step
  // (128 bf16 at AVX-512), one register (32), and the scalar tail.
  LevelReset reset;
  for (SimdLevel l : levelsToTest()) {
    kernels::forceSimdLevel(l);
    for (DType d : {DType::kFloat16, DType::kBFloat16}) {
      const float halfUlp = d == DType::kFloat16 ? 0x1p-11f : 0x1p-8f;
      ReduceArgs a;
      a.dtype = d;
      constexpr size_t kCount = 165;
      std::vector<Bytes> in(3, Bytes(2 * kCount));
      Bytes expected(2 * kCount);
      for (size_t i = 0; i < kCount; ++i) {
        const float x = std::ldexp(i % 2 ? -1.0f : 1.0f, static_cast<int>(i % 12) - 4);
        putFloat(d, in[0], i, x);
        putFloat(d, in[1], i, x * halfUlp);
        putFloat(d, in[2], i, x * halfUlp);
        putFloat(d, expected, i, x + 2 * x * halfUlp);
        INFO("expected value " << x + 2 * x * halfUlp);
        REQUIRE(get<uint16_t>(expected, i) != get<uint16_t>(in[0], i));  // the test itself: pairwise would differ
      }
      checkSame(std::string("single rounding ") + core::dtypeName(d) + " " + kernels::simdLevelName(l), expected,
                runReduce(a, in, -1, kCount), d);
    }
  }
}

TEST_CASE("a one-source reduce in place keeps the values, or scales them where the op does", "[shm][kernels]") {
  // A world-size-1 all-reduce reduces its tensor onto itself; ops that leave one term unchanged skip the pass.
  struct Case {
    RedOp op;
    double factor;
    int divisor;
    float expected;
  };
  for (const Case& c : {Case{RedOp::kSum, 1.0, 1, 3.0f}, Case{RedOp::kMax, 1.0, 1, 3.0f},
                        Case{RedOp::kAvg, 1.0, 1, 3.0f}, Case{RedOp::kAvg, 1.0, 2, 1.5f},
                        Case{RedOp::kPremulSum, 1.0, 1, 3.0f}, Case{RedOp::kPremulSum, 2.0, 1, 6.0f}}) {
    ReduceArgs a;
    a.op = c.op;
    a.factor = c.factor;
    a.divisor = c.divisor;
    std::vector<float> v(1000, 3.0f);
    const void* src = v.data();
    kernels::reduce(a, v.data(), &src, 1, v.size());
    INFO(core::redOpName(c.op) << " factor " << c.factor << " divisor " << c.divisor);
    REQUIRE(std::all_of(v.begin(), v.end(), [&](float x) { return x == c.expected; }));
  }
  // Bool normalises any nonzero byte to 1, so it always runs.
  ReduceArgs b;
  b.dtype = DType::kBool;
  b.op = RedOp::kMax;
  Bytes flags = {0, 1, 2, 255};
  const void* src = flags.data();
  kernels::reduce(b, flags.data(), &src, 1, flags.size());
  REQUIRE(flags == Bytes{0, 1, 1, 1});
}

TEST_CASE("MIN and MAX propagate NaN, identically at every level", "[shm][kernels]") {
  LevelReset reset;
  const std::vector<SimdLevel> levels = levelsToTest();
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (RedOp op : {RedOp::kMin, RedOp::kMax}) {
      for (int nsrc : {1, 2, 3, 8}) {
        const size_t count = 37;
        std::vector<Bytes> in(nsrc, Bytes(count * core::dtypeSize(d)));
        std::vector<bool> expectNan(count, false);
        for (size_t i = 0; i < count; ++i) {
          for (int r = 0; r < nsrc; ++r) {
            // NaN in a rotating source (first, middle, last), sometimes in two; infinities and signed zeros beside.
            const bool isNan = (i % 3 == 0 && r == static_cast<int>(i / 3) % nsrc) || (i % 11 == 0 && r == 0);
            const double zero = i % 2 ? 0.0 : -0.0;
            const double v = isNan ? nan : i % 5 == 0 ? (r % 2 ? inf : -inf) : r == 1 ? zero : r - 1.0;
            putFloat(d, in[r], i, v);
            if (isNan) expectNan[i] = true;
          }
        }
        ReduceArgs a;
        a.dtype = d, a.op = op;
        Bytes firstOut;
        for (SimdLevel l : levels) {
          kernels::forceSimdLevel(l);
          const Bytes out = runReduce(a, in, -1, count);
          for (size_t i = 0; i < count; ++i) {
            const double v = d == DType::kFloat32   ? get<float>(out, i)
                             : d == DType::kFloat64 ? get<double>(out, i)
                             : d == DType::kFloat16 ? halfValue(get<uint16_t>(out, i))
                                                    : bf16Value(get<uint16_t>(out, i));
            INFO(describe(a, nsrc, count, l, -1) << " index " << i << " value " << v);
            CHECK(std::isnan(v) == expectNan[i]);
          }
          if (l == levels.front()) firstOut = out;  // scalar, unless TUNEDIST_SIMD pins another
          checkSame("NaN bits vs scalar: " + describe(a, nsrc, count, l, -1), firstOut, out, d);
        }
      }
    }
  }
}

TEST_CASE("random bit patterns give the same bits at every level", "[shm][kernels]") {
  // Any float bits (NaN, Inf, subnormals, ties) and a factor that is not a power of two. Each element has at most
  // one NaN term: with two, which payload survives an add depends on operand order the compiler may swap.
  LevelReset reset;
  const std::vector<SimdLevel> levels = levelsToTest();
  std::mt19937_64 rng(12345);
  // Without NaN too: the SUM kernels round a register with no NaN lane a shorter way (infinities, subnormals and
  // results that round up to infinity must still match).
  for (const bool withNaN : {true, false})
    for (DType d : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      for (RedOp op : {RedOp::kSum, RedOp::kAvg, RedOp::kProduct, RedOp::kMin, RedOp::kMax, RedOp::kPremulSum}) {
        for (int nsrc : {1, 2, 3, 4}) {
          const size_t elem = core::dtypeSize(d), count = 3001;
          const int mantBits = d == DType::kFloat64 ? 52 : d == DType::kFloat32 ? 23 : d == DType::kFloat16 ? 10 : 7;
          const uint64_t quietBit = uint64_t{1} << (mantBits - 1);
          const uint64_t expMask = ((uint64_t{1} << (elem * 8 - 1)) - 1) & ~((uint64_t{1} << mantBits) - 1);
          const auto isNanBits = [&](uint64_t b) {
            const uint64_t mant = b & ((uint64_t{1} << mantBits) - 1);
            return (b & expMask) == expMask && mant != 0;
          };
          std::vector<Bytes> in(nsrc, Bytes(count * elem));
          for (size_t i = 0; i < count; ++i) {
            const int nanRank = withNaN ? static_cast<int>(rng() % (4 * nsrc)) : nsrc;  // >= nsrc: no NaN here
            for (int r = 0; r < nsrc; ++r) {
              uint64_t bits = rng();
              while (isNanBits(bits)) bits = rng();
              if (r == nanRank) bits |= expMask | (rng() % 2 ? quietBit : 1);  // a quiet or a signaling NaN
              std::memcpy(in[r].data() + i * elem, &bits, elem);
            }
          }
          ReduceArgs a;
          a.dtype = d, a.op = op, a.factor = 1.0 / 3.0, a.divisor = 3;
          Bytes firstOut;
          for (SimdLevel l : levels) {
            kernels::forceSimdLevel(l);
            const Bytes out = runReduce(a, in, 0, count, /*shift=*/true);
            if (l == levels.front()) firstOut = out;  // scalar, unless TUNEDIST_SIMD pins another
            checkSame(std::string(withNaN ? "" : "no NaN, ") +
                          "random bits vs scalar: " + describe(a, nsrc, count, l, 0),
                      firstOut, out, d);
          }
        }
      }
    }
}

TEST_CASE("unsupported combinations and bad arguments throw, naming op and dtype", "[shm][kernels]") {
  using Catch::Matchers::Contains;
  float x = 1, y = 2;
  const void* srcs[] = {&x, &y};
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (RedOp op : {RedOp::kBand, RedOp::kBor, RedOp::kBxor}) {
      ReduceArgs a;
      a.dtype = d, a.op = op;
      const std::string what = std::string(core::redOpName(op)) + " is not defined for " + core::dtypeName(d);
      CHECK_THROWS_WITH(kernels::reduce(a, &x, srcs, 2, 1), Contains(what));
      CHECK_THROWS_AS(kernels::checkReduceSupported(d, op), tunedist::core::Error);
    }
  }
  CHECK_THROWS_WITH(kernels::checkReduceSupported(DType::kBool, RedOp::kAvg), Contains("AVG is not defined for bool"));
  CHECK_THROWS_WITH(kernels::checkReduceSupported(DType::kBool, RedOp::kPremulSum),
                    Contains("PREMUL_SUM is not defined for bool"));
  CHECK_THROWS_WITH(kernels::checkReduceSupported(DType::kInt32, RedOp::kPremulSum),
                    Contains("PREMUL_SUM") && Contains("int32"));
  ReduceArgs a;  // float32 SUM
  CHECK_THROWS_WITH(kernels::reduce(a, &x, srcs, 0, 1), Contains("between 1 and 65536 sources"));
  a.op = RedOp::kAvg, a.divisor = 0;
  CHECK_THROWS_WITH(kernels::reduce(a, &x, srcs, 2, 1), Contains("divisor"));
  a.op = RedOp::kSum;
  float buf[8] = {};
  const void* overlapping[] = {buf, buf + 1};
  CHECK_THROWS_WITH(kernels::reduce(a, buf, overlapping, 2, 4), Contains("partially overlaps"));
  CHECK_NOTHROW(kernels::reduce(a, &x, srcs, 2, 0));  // count 0: nothing to do, even before pointers are looked at
}
