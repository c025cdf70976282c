// The low-rank kernels (lowrank.h), written once with GCC vector types of 8 floats and compiled per SIMD level:
// lowrank_scalar.cpp (baseline x86-64: each 8-float operation becomes two SSE ones) and lowrank_avx2.cpp (-mavx2
// -mfma: madd is one FMA). Both build with -ffp-contract=off: every fused multiply-add is an explicit madd.
// Everything is in an anonymous namespace, one private copy per level.
//
// Shapes and loops (row-major float32; r = the rank):
//   project   p = M Q:    (optionally M += E first, in the same pass) one row at a time, up to 4 columns of Q
//                         at once, each with 4 (1 column) or 2 vector partial sums along the row; qT's rows stay
//                         in L1. Each p element: its partial sums and their lanes added pairwise, plus the tail.
//   projectT  qT = (M^T P): per tile of columns (kTileFloats / r wide, so the accumulators stay in L1) and block of
//                         up to 4 columns of P, rows of M stream in order, one at a time; each qT element
//                         accumulates its terms in ascending row order.
//   expand    out = P Q^T (+ error): per row, v = sum over k of p[i][k] * qT[k] (k ascending), one pass writing
//                         out and err.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "kernels/lowrank_table_impl.h"

namespace tunedist::kernels {
namespace {

typedef float V8 __attribute__((vector_size(32)));
constexpr int64_t kLanes = 8;
// Accumulator tile of projectT: r * width floats (32 KiB).
constexpr int64_t kTileFloats = 8192;

inline V8 load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, const V8& v) { std::memcpy(p, &v, sizeof v); }
inline V8 splat8(float x) { return V8{x, x, x, x, x, x, x, x}; }
// a * b + c: one FMA (one rounding) in the AVX2 build, a product and a sum elsewhere. Spelled out rather than left
// to -ffp-contract, which GCC applies to scalar code but not to vector-extension code: the vector body and the
// scalar tails of a loop must round alike, or results would depend on where a row is split.
inline V8 madd8(const V8& a, const V8& b, const V8& c) {
#if defined(__FMA__)
  return reinterpret_cast<V8>(_mm256_fmadd_ps(reinterpret_cast<__m256>(a), reinterpret_cast<__m256>(b),
                                              reinterpret_cast<__m256>(c)));
#else
  return a * b + c;
#endif
}
inline float madd(float a, float b, float c) {
#if defined(__FMA__)
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}
inline float lanesSum(const V8& v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }

// p[i][k0 + c] for one row i and K columns from k0, with U partial sums per column along the row (element j of
// the vector body goes to sum (j / 8) % U, lane j % 8); the U sums are added pairwise, then their 8 lanes (lanesSum),
// then the tail columns in order. ADD: first m[i][j] += err[i][j] (stored back). One row at a time keeps one
// stream of M (and one of the error) in flight: blocks of several rows, each its own stream, ran this fused pass
// at half the bandwidth of a plain M += E here.
template <int K, int U, bool ADD>
inline void projectRow(float* m, const float* err, int64_t cols, const float* qT, int64_t r, float* p, int64_t i,
                       int64_t k0) {
  V8 acc[U][K];
  for (int u = 0; u < U; ++u)
    for (int c = 0; c < K; ++c) acc[u][c] = V8{};
  float* row = m + i * cols;
  const float* e = ADD ? err + i * cols : nullptr;
  const float* qs[K];
  for (int c = 0; c < K; ++c) qs[c] = qT + (k0 + c) * cols;
  constexpr int64_t kStep = U * kLanes;
  int64_t j = 0;
  for (; j + kStep <= cols; j += kStep) {
    V8 mv[U];
    for (int u = 0; u < U; ++u) {
      mv[u] = load8(row + j + u * kLanes);
      if constexpr (ADD) {
        mv[u] += load8(e + j + u * kLanes);
        store8(row + j + u * kLanes, mv[u]);
      }
    }
    for (int c = 0; c < K; ++c)
      for (int u = 0; u < U; ++u) acc[u][c] = madd8(mv[u], load8(qs[c] + j + u * kLanes), acc[u][c]);
  }
  // Whole vectors left over go to the first partial sums, in order.
  for (int u = 0; j + kLanes <= cols; ++u, j += kLanes) {
    V8 mv = load8(row + j);
    if constexpr (ADD) {
      mv += load8(e + j);
      store8(row + j, mv);
    }
    for (int c = 0; c < K; ++c) acc[u][c] = madd8(mv, load8(qs[c] + j), acc[u][c]);
  }
  if constexpr (ADD) {
    for (int64_t t = j; t < cols; ++t) row[t] += e[t];
  }
  for (int c = 0; c < K; ++c) {
    V8 sum = acc[0][c];
    if constexpr (U == 2) sum = acc[0][c] + acc[1][c];
    if constexpr (U == 4) sum = (acc[0][c] + acc[1][c]) + (acc[2][c] + acc[3][c]);
    float s = lanesSum(sum);
    for (int64_t t = j; t < cols; ++t) s = madd(row[t], qs[c][t], s);
    p[i * r + k0 + c] = s;
  }
}

// m is only written when err is not null; the error is added by the first block of columns only.
void project(float* m, const float* err, int64_t cols, const float* qT, int64_t r, float* p, int64_t rowBegin,
             int64_t rowEnd) {
  static_assert(kLanes == 8, "projectRow's partial sums assume 8 lanes");
  for (int64_t i = rowBegin; i < rowEnd; ++i) {
    for (int64_t k0 = 0; k0 < r; k0 += 4) {
      const bool add = err != nullptr && k0 == 0;
#define TD_PROJECT_CASE(K, U)                                   \
  if (add) {                                                    \
    projectRow<K, U, true>(m, err, cols, qT, r, p, i, k0);      \
  } else {                                                      \
    projectRow<K, U, false>(m, nullptr, cols, qT, r, p, i, k0); \
  }                                                             \
  break;
      switch (std::min<int64_t>(4, r - k0)) {
        case 1: TD_PROJECT_CASE(1, 4)
        case 2: TD_PROJECT_CASE(2, 2)
        case 3: TD_PROJECT_CASE(3, 2)
        default: TD_PROJECT_CASE(4, 2)
      }
#undef TD_PROJECT_CASE
    }
  }
}

// qT[k0 + c][j0 .. j1) += sum over rows i of m[i][j] * p[i][k0 + c], rows ascending, one row at a time: the
// accumulators (at most 32 KiB) stay in L1 and M streams once, in order (blocks of rows, one stream each, were
// slower here).
template <int K>
void projectTBlock(const float* m, int64_t rows, int64_t cols, const float* p, int64_t r, float* qT, int64_t k0,
                   int64_t j0, int64_t j1) {
  float* acc[K];
  for (int c = 0; c < K; ++c) acc[c] = qT + (k0 + c) * cols;
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = m + i * cols;
    float s[K];
    V8 w[K];
    for (int c = 0; c < K; ++c) {
      s[c] = p[i * r + k0 + c];
      w[c] = splat8(s[c]);
    }
    int64_t j = j0;
    for (; j + 2 * kLanes <= j1; j += 2 * kLanes) {
      const V8 a = load8(row + j), b = load8(row + j + kLanes);
      for (int c = 0; c < K; ++c) {
        store8(acc[c] + j, madd8(a, w[c], load8(acc[c] + j)));
        store8(acc[c] + j + kLanes, madd8(b, w[c], load8(acc[c] + j + kLanes)));
      }
    }
    for (; j + kLanes <= j1; j += kLanes) {
      const V8 a = load8(row + j);
      for (int c = 0; c < K; ++c) store8(acc[c] + j, madd8(a, w[c], load8(acc[c] + j)));
    }
    for (; j < j1; ++j)
      for (int c = 0; c < K; ++c) acc[c][j] = madd(row[j], s[c], acc[c][j]);
  }
}

void projectT(const float* m, int64_t rows, int64_t cols, const float* p, int64_t r, float* qT, int64_t colBegin,
              int64_t colEnd) {
  const int64_t width = std::max<int64_t>(kLanes, (kTileFloats / std::max<int64_t>(r, 1)) / kLanes * kLanes);
  for (int64_t j0 = colBegin; j0 < colEnd; j0 += width) {
    const int64_t j1 = std::min(colEnd, j0 + width);
    for (int64_t k = 0; k < r; ++k) std::fill(qT + k * cols + j0, qT + k * cols + j1, 0.0f);
    for (int64_t k0 = 0; k0 < r; k0 += 4) {
      switch (std::min<int64_t>(4, r - k0)) {
        case 1: projectTBlock<1>(m, rows, cols, p, r, qT, k0, j0, j1); break;
        case 2: projectTBlock<2>(m, rows, cols, p, r, qT, k0, j0, j1); break;
        case 3: projectTBlock<3>(m, rows, cols, p, r, qT, k0, j0, j1); break;
        default: projectTBlock<4>(m, rows, cols, p, r, qT, k0, j0, j1); break;
      }
    }
  }
}

// The error is written with streaming stores where it can be (AVX, every row 32-byte aligned): it is read back only
// at the next step, after the backward pass has evicted it, so caching its lines (and reading them first) is waste.
template <bool STREAM>
void expandRows(float* out, float* err, int64_t cols, const float* p, const float* qT, int64_t r, int64_t rowBegin,
                int64_t rowEnd) {
  for (int64_t i = rowBegin; i < rowEnd; ++i) {
    const float* pi = p + i * r;
    float* o = out + i * cols;
    float* e = err != nullptr ? err + i * cols : nullptr;
    int64_t j = 0;
    for (; j + kLanes <= cols; j += kLanes) {
      V8 v = splat8(pi[0]) * load8(qT + j);
      for (int64_t k = 1; k < r; ++k) v = madd8(splat8(pi[k]), load8(qT + k * cols + j), v);
      if (e != nullptr) {
        const V8 d = load8(o + j) - v;
#if defined(__AVX__)
        if constexpr (STREAM) {
          _mm256_stream_ps(e + j, reinterpret_cast<__m256>(d));
        } else {
          store8(e + j, d);
        }
#else
        store8(e + j, d);
#endif
      }
      store8(o + j, v);
    }
    for (; j < cols; ++j) {
      float v = pi[0] * qT[j];
      for (int64_t k = 1; k < r; ++k) v = madd(pi[k], qT[k * cols + j], v);
      if (e != nullptr) e[j] = o[j] - v;
      o[j] = v;
    }
  }
}

void expand(float* out, float* err, int64_t cols, const float* p, const float* qT, int64_t r, int64_t rowBegin,
            int64_t rowEnd) {
#if defined(__AVX__)
  if (err != nullptr && cols % kLanes == 0 && reinterpret_cast<uintptr_t>(err + rowBegin * cols) % 32 == 0) {
    expandRows<true>(out, err, cols, p, qT, r, rowBegin, rowEnd);
    _mm_sfence();  // streaming stores are weakly ordered: make them visible before the caller hands err on
    return;
  }
#endif
  expandRows<false>(out, err, cols, p, qT, r, rowBegin, rowEnd);
}

constexpr LowRankTable buildLowRankTable() { return LowRankTable{&project, &projectT, &expand}; }

}  // namespace
}  // namespace tunedist::kernels
