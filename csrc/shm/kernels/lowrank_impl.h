// The low-rank kernels (lowrank.h), written once with GCC vector types of 8 floats and compiled per SIMD level:
// lowrank_scalar.cpp (baseline x86-64: each 8-float operation becomes two SSE ones) and lowrank_avx2.cpp (-mavx2
// -mfma: madd is one FMA). Both build with -ffp-contract=off: every fused multiply-add is an explicit madd.
// Everything is in an anonymous namespace, one private copy per level.
//
// Shapes and loops (row-major float32; r = the rank):
//   project   p = M Q:    (optionally M += E first, in the same pass) per block of 4 rows (r <= 2) or 2 rows x up
//                         to 4 columns of Q, one vector accumulator per row and column walks the rows of M once;
//                         qT's rows stay in L1. Each p element: 8 lane sums, added pairwise, plus the tail.
//   projectT  qT = (M^T P): per tile of columns (kTileFloats / r wide, so the accumulators stay in L1) and block of
//                         up to 4 columns of P, rows of M stream in order, 4 at a time; each qT element
//                         accumulates its terms in ascending row order.
//   expand    out = P Q^T (+ error): per row, v = sum over k of p[i][k] * qT[k] (k ascending), one pass writing
//                         out and err.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__FMA__)
#include <immintrin.h>
#endif

#include "shm/kernels/lowrank_table_impl.h"

namespace tunedist::shm::kernels {
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
inline float lanesSum(const V8& v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// p[i][k0 + c] for ROWS rows from i and K columns from k0. ADD: first m[i][j] += err[i][j] (stored back).
template <int ROWS, int K, bool ADD>
inline void projectBlock(float* m, const float* err, int64_t cols, const float* qT, int64_t r, float* p, int64_t i,
                         int64_t k0) {
  V8 acc[ROWS][K];
  for (int a = 0; a < ROWS; ++a)
    for (int c = 0; c < K; ++c) acc[a][c] = V8{};
  float* rows[ROWS];
  const float* errs[ROWS];
  for (int a = 0; a < ROWS; ++a) {
    rows[a] = m + (i + a) * cols;
    errs[a] = ADD ? err + (i + a) * cols : nullptr;
  }
  const float* qs[K];
  for (int c = 0; c < K; ++c) qs[c] = qT + (k0 + c) * cols;
  int64_t j = 0;
  for (; j + kLanes <= cols; j += kLanes) {
    V8 mv[ROWS];
    for (int a = 0; a < ROWS; ++a) {
      mv[a] = load8(rows[a] + j);
      if constexpr (ADD) {
        mv[a] += load8(errs[a] + j);
        store8(rows[a] + j, mv[a]);
      }
    }
    for (int c = 0; c < K; ++c) {
      const V8 qv = load8(qs[c] + j);
      for (int a = 0; a < ROWS; ++a) acc[a][c] = madd8(mv[a], qv, acc[a][c]);
    }
  }
  for (int a = 0; a < ROWS; ++a) {
    if constexpr (ADD) {
      for (int64_t t = j; t < cols; ++t) rows[a][t] += errs[a][t];
    }
    for (int c = 0; c < K; ++c) {
      float s = lanesSum(acc[a][c]);
      for (int64_t t = j; t < cols; ++t) s = madd(rows[a][t], qs[c][t], s);
      p[(i + a) * r + k0 + c] = s;
    }
  }
}

// The error (if any) is added by the first block of columns only.
template <int ROWS>
inline void projectRows(float* m, const float* err, int64_t cols, const float* qT, int64_t r, float* p, int64_t i) {
  for (int64_t k0 = 0; k0 < r; k0 += 4) {
    const int k = static_cast<int>(std::min<int64_t>(4, r - k0));
    const bool add = err != nullptr && k0 == 0;
#define TD_PROJECT_CASE(K)                                                    \
  case K:                                                                     \
    if (add) {                                                                \
      projectBlock<ROWS, K, true>(m, err, cols, qT, r, p, i, k0);             \
    } else {                                                                  \
      projectBlock<ROWS, K, false>(m, nullptr, cols, qT, r, p, i, k0);        \
    }                                                                         \
    break;
    switch (k) {
      TD_PROJECT_CASE(1)
      TD_PROJECT_CASE(2)
      TD_PROJECT_CASE(3)
      default:
      TD_PROJECT_CASE(4)
    }
#undef TD_PROJECT_CASE
  }
}

// m is only written when err is not null.
void project(float* m, const float* err, int64_t cols, const float* qT, int64_t r, float* p, int64_t rowBegin,
             int64_t rowEnd) {
  int64_t i = rowBegin;
  if (r <= 2) {
    for (; i + 4 <= rowEnd; i += 4) projectRows<4>(m, err, cols, qT, r, p, i);
  }
  for (; i + 2 <= rowEnd; i += 2) projectRows<2>(m, err, cols, qT, r, p, i);
  if (i < rowEnd) projectRows<1>(m, err, cols, qT, r, p, i);
}

// qT[k0 + c][j0 .. j1) += sum over rows i of m[i][j] * p[i][k0 + c], rows ascending, 4 at a time.
template <int K>
void projectTBlock(const float* m, int64_t rows, int64_t cols, const float* p, int64_t r, float* qT, int64_t k0,
                   int64_t j0, int64_t j1) {
  float* acc[K];
  for (int c = 0; c < K; ++c) acc[c] = qT + (k0 + c) * cols;
  int64_t i = 0;
  for (; i + 4 <= rows; i += 4) {
    const float* r0 = m + i * cols;
    const float* r1 = r0 + cols;
    const float* r2 = r1 + cols;
    const float* r3 = r2 + cols;
    V8 w[4][K];
    float s[4][K];
    for (int a = 0; a < 4; ++a)
      for (int c = 0; c < K; ++c) {
        s[a][c] = p[(i + a) * r + k0 + c];
        w[a][c] = splat8(s[a][c]);
      }
    int64_t j = j0;
    for (; j + kLanes <= j1; j += kLanes) {
      const V8 m0 = load8(r0 + j), m1 = load8(r1 + j), m2 = load8(r2 + j), m3 = load8(r3 + j);
      for (int c = 0; c < K; ++c) {
        V8 v = load8(acc[c] + j);
        v = madd8(m0, w[0][c], v);
        v = madd8(m1, w[1][c], v);
        v = madd8(m2, w[2][c], v);
        v = madd8(m3, w[3][c], v);
        store8(acc[c] + j, v);
      }
    }
    for (; j < j1; ++j) {
      for (int c = 0; c < K; ++c) {
        float v = acc[c][j];
        v = madd(r0[j], s[0][c], v);
        v = madd(r1[j], s[1][c], v);
        v = madd(r2[j], s[2][c], v);
        v = madd(r3[j], s[3][c], v);
        acc[c][j] = v;
      }
    }
  }
  for (; i < rows; ++i) {
    const float* row = m + i * cols;
    for (int c = 0; c < K; ++c) {
      const float s = p[i * r + k0 + c];
      const V8 w = splat8(s);
      int64_t j = j0;
      for (; j + kLanes <= j1; j += kLanes) store8(acc[c] + j, madd8(load8(row + j), w, load8(acc[c] + j)));
      for (; j < j1; ++j) acc[c][j] = madd(row[j], s, acc[c][j]);
    }
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

void expand(float* out, float* err, int64_t cols, const float* p, const float* qT, int64_t r, int64_t rowBegin,
            int64_t rowEnd) {
  for (int64_t i = rowBegin; i < rowEnd; ++i) {
    const float* pi = p + i * r;
    float* o = out + i * cols;
    float* e = err != nullptr ? err + i * cols : nullptr;
    int64_t j = 0;
    for (; j + kLanes <= cols; j += kLanes) {
      V8 v = splat8(pi[0]) * load8(qT + j);
      for (int64_t k = 1; k < r; ++k) v = madd8(splat8(pi[k]), load8(qT + k * cols + j), v);
      if (e != nullptr) store8(e + j, load8(o + j) - v);
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

constexpr LowRankTable buildLowRankTable() { return LowRankTable{&project, &projectT, &expand}; }

}  // namespace
}  // namespace tunedist::shm::kernels
