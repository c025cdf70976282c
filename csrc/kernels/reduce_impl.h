// The reduction and copy kernels, written once and compiled once per SIMD level: reduce_scalar.cpp,
// reduce_avx2.cpp and reduce_avx512.cpp each include this header under their own -m flags and export the table
// that buildKernelTable() returns. The auto-vectoriser does the SIMD work, so every loop below is a plain
// element-wise loop over __restrict pointers; only the half-precision conversions, the streaming copy and the
// SUM of float32/bf16/fp16 at the AVX2 and AVX-512 levels (sumInRegisters, one pass with the accumulator in
// registers) use intrinsics, where the level has them.
//
// Reduction algorithm, per block of kBlockBytes of accumulator (kept on the stack, so it stays in L1):
//   1. acc[i] = pre(widen(srcs[0][i]))                 (pre multiplies by the PREMUL_SUM factor, else identity)
//   2. for s = 1 .. nsrc-1: acc[i] = combine(acc[i], pre(widen(srcs[s][i])))   (strictly left to right)
//   3. out[i] = narrow(post(acc[i]))                     (post divides for AVG, else identity)
// Every source element of a block is read before the block's output is written, which is what makes
// out == srcs[k] safe. fp16/bf16 accumulate in float and round once, in step 3.
//
// Everything is in an anonymous namespace: see convert_impl.h for why each level needs its own private copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels/compress_impl.h"
#include "kernels/convert_impl.h"
#include "kernels/kernel_table_impl.h"

namespace tunedist::kernels {
namespace {

// Accumulator bytes per block: 1024 floats. Small enough to stay in L1 with the source stream and the fp16
// conversion buffer beside it, large enough that per-block overhead (one pass per source) is negligible.
constexpr size_t kBlockBytes = 4096;

// From this size up the AVX2/AVX-512 copy uses non-temporal stores; see copyKernel for the measurements.
constexpr size_t kStreamCopyMinBytes = size_t{16} << 10;

// ---- Operators: pre() on every term, combine() folds a term into the accumulator, post() before narrowing. ----

template <typename A>
struct SumOp {
  explicit SumOp(const ReduceArgs&) {}
  A pre(A x) const { return x; }
  A combine(A acc, A x) const { return static_cast<A>(acc + x); }
  A post(A acc) const { return acc; }
};

template <typename A>
struct ProductOp {
  explicit ProductOp(const ReduceArgs&) {}
  A pre(A x) const { return x; }
  // Integer accumulators are unsigned of at least 8 bits; uint8 operands promote to int, where 255 * 255 fits.
  A combine(A acc, A x) const { return static_cast<A>(acc * x); }
  A post(A acc) const { return acc; }
};

// MIN/MAX of floats propagate NaN: if either operand is NaN the result is that NaN. Written as a select on
// explicit comparisons because std::min and vminps are not NaN-propagating (they return an operand by position),
// and the result must be the same at every level. Ties (-0 vs +0) keep the accumulator.
template <typename A>
struct MinOp {
  explicit MinOp(const ReduceArgs&) {}
  A pre(A x) const { return x; }
  A combine(A acc, A x) const {
    if constexpr (std::is_floating_point_v<A>) {
      return ((x < acc) | (x != x)) ? x : acc;
    } else {
      return x < acc ? x : acc;
    }
  }
  A post(A acc) const { return acc; }
};

template <typename A>
struct MaxOp {
  explicit MaxOp(const ReduceArgs&) {}
  A pre(A x) const { return x; }
  A combine(A acc, A x) const {
    if constexpr (std::is_floating_point_v<A>) {
      return ((x > acc) | (x != x)) ? x : acc;
    } else {
      return x > acc ? x : acc;
    }
  }
  A post(A acc) const { return acc; }
};

template <typename A>
struct BandOp {
  explicit BandOp(const ReduceArgs&) {}
  A pre(A x) const { return x; }
  A combine(A acc, A x) const { return static_cast<A>(acc & x); }
  A post(A acc) const { return acc; }
};

template <typename A>
struct BorOp {
  explicit BorOp(const ReduceArgs&) {}
  A pre(A x) const { return x; }
  A combine(A acc, A x) const { return static_cast<A>(acc | x); }
  A post(A acc) const { return acc; }
};

template <typename A>
struct BxorOp {
  explicit BxorOp(const ReduceArgs&) {}
  A pre(A x) const { return x; }
  A combine(A acc, A x) const { return static_cast<A>(acc ^ x); }
  A post(A acc) const { return acc; }
};

// Floats divide in the accumulator type; int64 (accumulated in uint64 by Int64AvgCodec) divides as int64,
// truncating toward zero; smaller integers divide in double and SmallIntAvgCodec truncates. reduce() guarantees
// divisor >= 1.
template <typename A>
struct AvgOp {
  explicit AvgOp(const ReduceArgs& args) : divisor_(args.divisor) {}
  A pre(A x) const { return x; }
  A combine(A acc, A x) const { return static_cast<A>(acc + x); }
  A post(A acc) const {
    if constexpr (std::is_floating_point_v<A>) {
      return acc / static_cast<A>(divisor_);
    } else {
      return static_cast<A>(static_cast<int64_t>(acc) / static_cast<int64_t>(divisor_));
    }
  }
  int divisor_;
};

// Floating types only: the factor is rounded to the accumulator type once, then every term is multiplied by it.
template <typename A>
struct PremulSumOp {
  static_assert(std::is_floating_point_v<A>, "PREMUL_SUM is defined for floating types only");
  explicit PremulSumOp(const ReduceArgs& args) : factor_(static_cast<A>(args.factor)) {}
  A pre(A x) const { return x * factor_; }
  A combine(A acc, A x) const { return acc + x; }
  A post(A acc) const { return acc; }
  A factor_;
};

// ---- fp16 block conversions: F16C where the level has it (4x faster than the manual code), else manual. ----
// (widenHalfBlock is in compress_impl.h, which the compression kernels share.)

inline void narrowHalfBlock(uint16_t* __restrict dst, const float* __restrict src, size_t n) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
#endif
  for (; i < n; ++i) dst[i] = floatToHalf(src[i]);
}

// ---- The kernel. ----
// The three block steps are kept out of line: inlined into the loop over sources, GCC 12 unrolls that loop by two
// and fuses two nextTerm loops into one it then leaves scalar (int8 SUM of 4 sources ran at 4 GB/s instead of 30).
// Out of line, each is a single loop over __restrict pointers that vectorises; a call per 4 KiB block costs nothing.

template <typename Codec, typename Op>
__attribute__((noinline)) void firstTerm(typename Codec::Acc* __restrict acc,
                                         const typename Codec::Storage* __restrict src, size_t n, const Op& op) {
  if constexpr (Codec::kHalf) {
    widenHalfBlock(acc, src, n);
    for (size_t i = 0; i < n; ++i) acc[i] = op.pre(acc[i]);
  } else {
    for (size_t i = 0; i < n; ++i) acc[i] = op.pre(Codec::widen(src[i]));
  }
}

template <typename Codec, typename Op>
__attribute__((noinline)) void nextTerm(typename Codec::Acc* __restrict acc,
                                        const typename Codec::Storage* __restrict src, size_t n, const Op& op) {
  using A = typename Codec::Acc;
  if constexpr (Codec::kHalf) {
    alignas(64) A term[kBlockBytes / sizeof(A)];
    widenHalfBlock(term, src, n);
    for (size_t i = 0; i < n; ++i) acc[i] = op.combine(acc[i], op.pre(term[i]));
  } else {
    for (size_t i = 0; i < n; ++i) acc[i] = op.combine(acc[i], op.pre(Codec::widen(src[i])));
  }
}

template <typename Codec, typename Op>
__attribute__((noinline)) void lastStep(typename Codec::Storage* __restrict out, typename Codec::Acc* __restrict acc,
                                        size_t n, const Op& op) {
  if constexpr (Codec::kHalf) {
    for (size_t i = 0; i < n; ++i) acc[i] = op.post(acc[i]);
    narrowHalfBlock(out, acc, n);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = Codec::narrow(op.post(acc[i]));
  }
}

#if (defined(__AVX512F__) && defined(__AVX512BW__)) || (defined(__AVX2__) && defined(__F16C__))
// ---- SUM of float32, bf16 and fp16 in one pass, the accumulator in registers (AVX-512 and AVX2 levels). ----
// The blocked kernel above stores the accumulator to L1 and loads it back once per source, and converts half
// types in separate passes; for SUM of these three types (what all_reduce and reduce_scatter mostly carry) that
// traffic, not memory, bounded it: 2 sources, data in L2, 256 KiB, AVX-512 on a 2-vCPU Intel Xeon (Sapphire Rapids):
// float32 17 us, bf16 50 us, fp16 50 us, in one pass 10-13, 24-34, 12-27 us. The arithmetic is the blocked
// kernel's exactly (widen each term, add left to right in float, round once with the same rounding), so results are
// bit-identical to every other level.
// GCC 12 warns (-Wmaybe-uninitialized) inside avx512fintrin.h on the _mm512_undefined_* operand of many unmasked
// intrinsics (GCC bug 105593); the operand is never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// floatToBf16 (convert_impl.h) on every lane of a GCC vector of uint32 (the float bits), leaving each result in the
// low 16 bits of its lane: round to nearest even; a NaN keeps its top payload bits and gets the quiet bit.
template <typename U32s>
U32s bf16Rounded(U32s w) {
  const U32s rounded = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;
  const U32s nan = (w >> 16) | 0x40u;
  return (w & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded;
}

// The same where no lane is a NaN (infinities included: they stay infinities), which the caller has checked.
template <typename U32s>
U32s bf16RoundedNoNaN(U32s w) {
  return (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// What every type's lanes share at this level: the register (float lanes, the accumulator) and its add.
struct FloatRegister {
  using Vec = __m512;
  static constexpr size_t kWidth = 16;
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
};

struct Float32Lanes : FloatRegister {
  using Storage = float;
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
};

// bf16 two float registers at a time: one 64-byte load is widened by interleaving zero words below each bf16
// (unpack: words 0-3 of every 128-bit lane into `lo`, 4-7 into `hi`), and one packus after rounding puts every word
// back in its place. The elements sit in the registers in another order, the same for every source, and the
// arithmetic on each is unchanged; against one register with a lane-crossing widen (vpmovzxwd + shift) and narrow
// (vpmovdw), 2 sources at 16 KiB took 1.19 us, with this one 0.78 (AVX-512 level, a 2-vCPU AMD EPYC, Zen 4).
struct BFloat16Lanes {
  struct Vec {
    __m512 lo, hi;
  };
  using Storage = uint16_t;
  static constexpr size_t kWidth = 32;
  static Vec add(Vec a, Vec b) { return {_mm512_add_ps(a.lo, b.lo), _mm512_add_ps(a.hi, b.hi)}; }
  static Vec load(const uint16_t* p) {
    const __m512i x = _mm512_loadu_si512(p);
    const __m512i zero = _mm512_setzero_si512();
    return {_mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, x)), _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, x))};
  }
  static void store(uint16_t* p, Vec v) {
    using U32x16 = uint32_t __attribute__((vector_size(64)));
    const auto lo = reinterpret_cast<U32x16>(v.lo), hi = reinterpret_cast<U32x16>(v.hi);
    const bool nan = (_mm512_cmp_ps_mask(v.lo, v.lo, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v.hi, v.hi, _CMP_UNORD_Q)) != 0;
    const U32x16 rlo = __builtin_expect(nan, 0) ? bf16Rounded(lo) : bf16RoundedNoNaN(lo);
    const U32x16 rhi = __builtin_expect(nan, 0) ? bf16Rounded(hi) : bf16RoundedNoNaN(hi);
    // Every lane is below 2^16: the pack only narrows.
    _mm512_storeu_si512(p, _mm512_packus_epi32(reinterpret_cast<__m512i>(rlo), reinterpret_cast<__m512i>(rhi)));
  }
};

// The same conversions as the F16C block conversions of the AVX2 level (IEEE, round to nearest even).
struct HalfLanes : FloatRegister {
  using Storage = uint16_t;
  static Vec load(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void store(uint16_t* p, Vec v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
};
#else
struct FloatRegister {
  using Vec = __m256;
  static constexpr size_t kWidth = 8;
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
};

struct Float32Lanes : FloatRegister {
  using Storage = float;
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
};

// As at the AVX-512 level: two registers at a time, widened by unpacking and narrowed by one in-lane pack.
struct BFloat16Lanes {
  struct Vec {
    __m256 lo, hi;
  };
  using Storage = uint16_t;
  static constexpr size_t kWidth = 16;
  static Vec add(Vec a, Vec b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
  static Vec load(const uint16_t* p) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i zero = _mm256_setzero_si256();
    return {_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, x)), _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, x))};
  }
  static void store(uint16_t* p, Vec v) {
    using U32x8 = uint32_t __attribute__((vector_size(32)));
    const auto lo = reinterpret_cast<U32x8>(v.lo), hi = reinterpret_cast<U32x8>(v.hi);
    const bool nan = _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(v.lo, v.lo, _CMP_UNORD_Q),
                                                     _mm256_cmp_ps(v.hi, v.hi, _CMP_UNORD_Q))) != 0;
    const U32x8 rlo = __builtin_expect(nan, 0) ? bf16Rounded(lo) : bf16RoundedNoNaN(lo);
    const U32x8 rhi = __builtin_expect(nan, 0) ? bf16Rounded(hi) : bf16RoundedNoNaN(hi);
    // Every lane is below 2^16: the pack only narrows.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm256_packus_epi32(reinterpret_cast<__m256i>(rlo), reinterpret_cast<__m256i>(rhi)));
  }
};

struct HalfLanes : FloatRegister {
  using Storage = uint16_t;
  static Vec load(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static void store(uint16_t* p, Vec v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
};
#endif

template <typename Codec>
struct LanesFor {
  using type = void;
};
template <>
struct LanesFor<PlainCodec<float, float>> {
  using type = Float32Lanes;
};
template <>
struct LanesFor<BFloat16Codec> {
  using type = BFloat16Lanes;
};
template <>
struct LanesFor<HalfCodec> {
  using type = HalfLanes;
};

// out[i] = ((srcs[0][i] + srcs[1][i]) + ...) for 4 registers of elements per step, then one register, then a scalar
// tail through Codec. All sources of a step are read before its output is written, so out == srcs[k] is safe.
template <typename Lanes, typename Codec>
void sumInRegisters(void* out, const void* const* srcs, int nsrc, size_t count) {
  using S = typename Lanes::Storage;
  using V = typename Lanes::Vec;
  constexpr size_t W = Lanes::kWidth;
  S* dst = static_cast<S*>(out);
  auto src = [srcs](int s) { return static_cast<const S*>(srcs[s]); };
  size_t i = 0;
  for (; i + 4 * W <= count; i += 4 * W) {
    V a0 = Lanes::load(src(0) + i), a1 = Lanes::load(src(0) + i + W);
    V a2 = Lanes::load(src(0) + i + 2 * W), a3 = Lanes::load(src(0) + i + 3 * W);
    for (int s = 1; s < nsrc; ++s) {
      const S* p = src(s) + i;
      a0 = Lanes::add(a0, Lanes::load(p));
      a1 = Lanes::add(a1, Lanes::load(p + W));
      a2 = Lanes::add(a2, Lanes::load(p + 2 * W));
      a3 = Lanes::add(a3, Lanes::load(p + 3 * W));
    }
    Lanes::store(dst + i, a0);
    Lanes::store(dst + i + W, a1);
    Lanes::store(dst + i + 2 * W, a2);
    Lanes::store(dst + i + 3 * W, a3);
  }
  for (; i + W <= count; i += W) {
    V a = Lanes::load(src(0) + i);
    for (int s = 1; s < nsrc; ++s) a = Lanes::add(a, Lanes::load(src(s) + i));
    Lanes::store(dst + i, a);
  }
  for (; i < count; ++i) {
    float a = Codec::widen(src(0)[i]);
    for (int s = 1; s < nsrc; ++s) a = a + Codec::widen(src(s)[i]);
    dst[i] = Codec::narrow(a);
  }
}
#pragma GCC diagnostic pop
#endif

template <typename Codec, typename Op>
void reduceKernel(const ReduceArgs& args, void* out, const void* const* srcs, int nsrc, size_t count) {
#if (defined(__AVX512F__) && defined(__AVX512BW__)) || (defined(__AVX2__) && defined(__F16C__))
  if constexpr (std::is_same_v<Op, SumOp<float>> && !std::is_void_v<typename LanesFor<Codec>::type>) {
    sumInRegisters<typename LanesFor<Codec>::type, Codec>(out, srcs, nsrc, count);
    return;
  }
#endif
  using S = typename Codec::Storage;
  using A = typename Codec::Acc;
  constexpr size_t kBlock = kBlockBytes / sizeof(A);
  alignas(64) A acc[kBlock];
  const Op op(args);
  S* dst = static_cast<S*>(out);
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t n = count - base < kBlock ? count - base : kBlock;
    firstTerm<Codec>(acc, static_cast<const S*>(srcs[0]) + base, n, op);
    for (int s = 1; s < nsrc; ++s) nextTerm<Codec>(acc, static_cast<const S*>(srcs[s]) + base, n, op);
    lastStep<Codec>(dst + base, acc, n, op);
  }
}

// ---- Copy. ----

#if defined(__AVX2__)
// Stores one 128-byte block (four vectors) at p: non-temporal stores (p 32-byte aligned) or plain ones.
template <bool kStream>
inline void storeBlock(char* p, __m256i a, __m256i b, __m256i c, __m256i e) {
  auto* q = reinterpret_cast<__m256i*>(p);
  if constexpr (kStream) {
    _mm256_stream_si256(q, a);
    _mm256_stream_si256(q + 1, b);
    _mm256_stream_si256(q + 2, c);
    _mm256_stream_si256(q + 3, e);
  } else {
    _mm256_storeu_si256(q, a);
    _mm256_storeu_si256(q + 1, b);
    _mm256_storeu_si256(q + 2, c);
    _mm256_storeu_si256(q + 3, e);
  }
}

// dst is read next by another process (a shared-memory slot). Non-temporal stores skip the read-for-ownership of
// lines the readers still hold and do not leave dst dirty in this core's cache, where a reader on another core
// would have to snoop it out. The sfence orders the streamed stores before the caller's release store that
// publishes them.
inline void streamCopy(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  // Streaming stores need 32-byte aligned destinations; copy the head up to a cache-line boundary normally.
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
  std::memcpy(d, s, head);
  size_t i = head;
  for (; i + 128 <= bytes; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    storeBlock<true>(d + i, a, b, c, e);
  }
  _mm_sfence();
  std::memcpy(d + i, s + i, bytes - i);
}
#endif

// Measured on a 2-vCPU AMD EPYC (Zen 3, AVX2, 32 MiB L3; /tmp copy-then-read benchmark, one core
// copies a chunk into one of 4 slots, the other core then reads it, variants interleaved per iteration, GB/s =
// bytes / mean time of copy + read; the host moves the two vCPUs between near (~90 ns one-way) and far
// (~250-380 ns) core pairs every few hundred ms, and the means include both):
//   chunk           16K   64K  256K    1M    4M
//   memcpy, cold    3.1   2.2   2.6   2.5   2.9    (source streamed from a 256 MiB buffer)
//   stream, cold    8.6   6.8   6.3   5.7   4.7
//   memcpy, hot     3.0   1.6   2.1   2.2   4.3    (source in cache)
//   stream, hot    10.9   3.3   4.6   4.9   8.7
// At 8K streaming already wins (7.5 vs 2.5), at 2-4K it does not reliably. When the same core reads dst next,
// memcpy wins instead (e.g. 256K hot: 20.7 vs 9.9; cold: 12.4 vs 9.8), hence copyBytesCached. rep movsb and an
// AVX2 loop with normal stores measured the same as memcpy. The AVX-512 level uses the same 256-bit loop: it
// could not be measured here, and the copy is bound by memory, not by vector width.
inline void copyKernel(void* dst, const void* src, size_t bytes) {
#if defined(__AVX2__)
  if (bytes >= kStreamCopyMinBytes) {
    streamCopy(dst, src, bytes);
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

// Copies src into `shared` and `own` in one pass (copyBytesTwice in reduce.h): each 128-byte block is loaded once and
// stored twice. A destination asked to stream (at least kStreamCopyMinBytes) gets non-temporal stores from its first
// cache-line boundary on, and an sfence ends them. Non-temporal stores need aligned destinations, so where both are to
// stream and their addresses differ modulo 32, `own` is stored cached.
#if defined(__AVX2__)
template <bool kStreamShared, bool kStreamOwn>
inline size_t copyTwiceBlocks(char* d, char* o, const char* s, size_t i, size_t bytes) {
  for (; i + 128 <= bytes; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    storeBlock<kStreamShared>(d + i, a, b, c, e);
    storeBlock<kStreamOwn>(o + i, a, b, c, e);
  }
  return i;
}
#endif

inline void copyTwiceKernel(void* shared, void* own, const void* src, size_t bytes, bool streamShared, bool streamOwn) {
#if defined(__AVX2__)
  auto* d = static_cast<char*>(shared);
  auto* o = static_cast<char*>(own);
  const auto* s = static_cast<const char*>(src);
  const bool toShared = streamShared && bytes >= kStreamCopyMinBytes;
  const bool toOwn = streamOwn && bytes >= kStreamCopyMinBytes &&
                     (!toShared || ((reinterpret_cast<uintptr_t>(d) ^ reinterpret_cast<uintptr_t>(o)) & 31) == 0);
  size_t i = 0;
  if (toShared || toOwn) {
    i = (64 - (reinterpret_cast<uintptr_t>(toShared ? d : o) & 63)) & 63;
    std::memcpy(d, s, i);
    std::memcpy(o, s, i);
  }
  if (toShared && toOwn) {
    i = copyTwiceBlocks<true, true>(d, o, s, i, bytes);
  } else if (toShared) {
    i = copyTwiceBlocks<true, false>(d, o, s, i, bytes);
  } else if (toOwn) {
    i = copyTwiceBlocks<false, true>(d, o, s, i, bytes);
  } else {
    i = copyTwiceBlocks<false, false>(d, o, s, i, bytes);
  }
  if (toShared || toOwn) {
    _mm_sfence();
  }
  std::memcpy(d + i, s + i, bytes - i);
  std::memcpy(o + i, s + i, bytes - i);
#else
  copyKernel(shared, src, bytes);  // the portable level's copies are memcpy either way
  (void)streamShared;
  (void)streamOwn;
  std::memcpy(own, src, bytes);
#endif
}

// ---- The table. ----

constexpr int opIndex(core::RedOp op) { return static_cast<int>(op); }

template <typename Codec, template <typename> class Op>
constexpr ReduceFn kernelFor() {
  return &reduceKernel<Codec, Op<typename Codec::Acc>>;
}

template <typename Codec>
constexpr void addFloating(KernelTable& t, core::DType dtype) {
  ReduceFn* row = t.reduce[static_cast<int>(dtype)];
  row[opIndex(core::RedOp::kSum)] = kernelFor<Codec, SumOp>();
  row[opIndex(core::RedOp::kAvg)] = kernelFor<Codec, AvgOp>();
  row[opIndex(core::RedOp::kProduct)] = kernelFor<Codec, ProductOp>();
  row[opIndex(core::RedOp::kMin)] = kernelFor<Codec, MinOp>();
  row[opIndex(core::RedOp::kMax)] = kernelFor<Codec, MaxOp>();
  row[opIndex(core::RedOp::kPremulSum)] = kernelFor<Codec, PremulSumOp>();
}

// Wrapping ops accumulate in the unsigned twin, MIN/MAX in the type itself, AVG in double or (int64) in 64 bits.
template <typename S>
constexpr void addInteger(KernelTable& t, core::DType dtype) {
  using Wrap = PlainCodec<S, std::make_unsigned_t<S>>;
  using Self = PlainCodec<S, S>;
  using Avg = std::conditional_t<sizeof(S) == 8, Int64AvgCodec,
                                 SmallIntAvgCodec<S, std::conditional_t<sizeof(S) == 1, float, double>>>;
  ReduceFn* row = t.reduce[static_cast<int>(dtype)];
  row[opIndex(core::RedOp::kSum)] = kernelFor<Wrap, SumOp>();
  row[opIndex(core::RedOp::kAvg)] = kernelFor<Avg, AvgOp>();
  row[opIndex(core::RedOp::kProduct)] = kernelFor<Wrap, ProductOp>();
  row[opIndex(core::RedOp::kMin)] = kernelFor<Self, MinOp>();
  row[opIndex(core::RedOp::kMax)] = kernelFor<Self, MaxOp>();
  row[opIndex(core::RedOp::kBand)] = kernelFor<Wrap, BandOp>();
  row[opIndex(core::RedOp::kBor)] = kernelFor<Wrap, BorOp>();
  row[opIndex(core::RedOp::kBxor)] = kernelFor<Wrap, BxorOp>();
}

// Bool: SUM and MAX are logical or, PRODUCT and MIN logical and.
constexpr void addBool(KernelTable& t) {
  ReduceFn* row = t.reduce[static_cast<int>(core::DType::kBool)];
  row[opIndex(core::RedOp::kSum)] = kernelFor<BoolCodec, BorOp>();
  row[opIndex(core::RedOp::kProduct)] = kernelFor<BoolCodec, BandOp>();
  row[opIndex(core::RedOp::kMin)] = kernelFor<BoolCodec, BandOp>();
  row[opIndex(core::RedOp::kMax)] = kernelFor<BoolCodec, BorOp>();
  row[opIndex(core::RedOp::kBand)] = kernelFor<BoolCodec, BandOp>();
  row[opIndex(core::RedOp::kBor)] = kernelFor<BoolCodec, BorOp>();
  row[opIndex(core::RedOp::kBxor)] = kernelFor<BoolCodec, BxorOp>();
}

constexpr KernelTable buildKernelTable() {
  KernelTable t{};
  addFloating<PlainCodec<float, float>>(t, core::DType::kFloat32);
  addFloating<PlainCodec<double, double>>(t, core::DType::kFloat64);
  addFloating<HalfCodec>(t, core::DType::kFloat16);
  addFloating<BFloat16Codec>(t, core::DType::kBFloat16);
  addInteger<int8_t>(t, core::DType::kInt8);
  addInteger<uint8_t>(t, core::DType::kUInt8);
  addInteger<int32_t>(t, core::DType::kInt32);
  addInteger<int64_t>(t, core::DType::kInt64);
  addBool(t);
  t.copy = &copyKernel;
  t.copyTwice = &copyTwiceKernel;
  t.compress[0] = &compressKernel<true>;
  t.compress[1] = &compressKernel<false>;
  t.decompress[0] = &decompressKernel<true>;
  t.decompress[1] = &decompressKernel<false>;
  return t;
}

}  // namespace
}  // namespace tunedist::kernels
