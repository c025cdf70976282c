// Low-rank (PowerSGD) kernels: P = M Q, Q = M^T P (written transposed), M = P Q^T with the error, M += E fused
// with P = M Q, Gram-Schmidt, transpose; against float64 references within the float32 rounding bound, at every
// SIMD level, on odd shapes (vector tails, one row, rank above the 4-column blocks); results independent of how
// rows or columns are split over calls; and the argument checks.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <new>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/lowrank.h"
#include "shm_kernel_test_util.h"

namespace {

namespace kernels = tunedist::kernels;
using tunedist::test::LevelReset;
using tunedist::test::levelsToTest;
using Floats = std::vector<float>;

// 64-byte aligned floats, to reach the streaming-store path of lowRankExpand.
class AlignedFloats {
 public:
  explicit AlignedFloats(size_t n) : data_(static_cast<float*>(::operator new(n * sizeof(float), kAlign))) {}
  ~AlignedFloats() { ::operator delete(data_, kAlign); }
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  float* data() const { return data_; }

 private:
  static constexpr std::align_val_t kAlign{64};
  float* data_;
};

Floats randomFloats(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Floats v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Checks got[i][j] against sum_t a(i, t) * b(t, j) computed in double, within the worst-case float32 rounding of a
// k-term sum: (k + 2) * 2^-24 * sum_t |a(i, t) * b(t, j)| (+ |base| when the result is base - product).
template <class A, class B>
void checkProduct(const Floats& got, int64_t rows, int64_t cols, int64_t k, A a, B b, const Floats* base = nullptr) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      double exact = 0.0, scale = 0.0;
      for (int64_t t = 0; t < k; ++t) {
        exact += double(a(i, t)) * double(b(t, j));
        scale += std::fabs(double(a(i, t)) * double(b(t, j)));
      }
      if (base != nullptr) {
        exact = double((*base)[size_t(i * cols + j)]) - exact;
        scale += std::fabs(double((*base)[size_t(i * cols + j)]));
      }
      const double bound = double(k + 2) * std::ldexp(1.0, -24) * scale + 1e-30;
      const double err = std::fabs(double(got[size_t(i * cols + j)]) - exact);
      INFO("element (" << i << ", " << j << ") of " << rows << " x " << cols << ", k = " << k);
      REQUIRE(err <= bound);
    }
  }
}

struct Shape {
  int64_t n, m, r;
};

const Shape kShapes[] = {{512, 384, 1}, {37, 13, 3}, {1, 9, 1},    {9, 1, 1},  {300, 301, 4},
                         {64, 40, 7},   {8, 8, 8},   {5, 1030, 2}, {7, 93, 1}, {6, 90, 2}};

}  // namespace

TEST_CASE("low-rank products match float64 references at every SIMD level", "[shm][kernels][lowrank]") {
  LevelReset reset;
  for (kernels::SimdLevel level : levelsToTest()) {
    kernels::forceSimdLevel(level);
    for (const Shape& s : kShapes) {
      {
        INFO("level " << kernels::simdLevelName(level) << ", M " << s.n << " x " << s.m << ", r " << s.r);
        const int64_t n = s.n, m = s.m, r = s.r;
        const Floats mat = randomFloats(size_t(n * m), uint32_t(n * 7 + m));
        const Floats q = randomFloats(size_t(m * r), uint32_t(r + 11));
        Floats qT(size_t(r * m));
        kernels::transposeFloat(qT.data(), q.data(), m, r);
        for (int64_t j = 0; j < m; ++j)
          for (int64_t k = 0; k < r; ++k) REQUIRE(qT[size_t(k * m + j)] == q[size_t(j * r + k)]);

        // 1. P = M Q.
        Floats p(size_t(n * r), std::numeric_limits<float>::quiet_NaN());
        kernels::lowRankProject(mat.data(), m, qT.data(), r, p.data(), 0, n);
        checkProduct(
            p, n, r, m, [&](int64_t i, int64_t t) { return mat[size_t(i * m + t)]; },
            [&](int64_t t, int64_t k) { return q[size_t(t * r + k)]; });

        // 2. Q = M^T P, written transposed.
        Floats q2T(size_t(r * m), std::numeric_limits<float>::quiet_NaN());
        kernels::lowRankProjectT(mat.data(), n, m, p.data(), r, q2T.data(), 0, m);
        checkProduct(
            q2T, r, m, n, [&](int64_t k, int64_t i) { return p[size_t(i * r + k)]; },
            [&](int64_t i, int64_t j) { return mat[size_t(i * m + j)]; });

        // 3. out = P Q^T, err = old out - new out, in one pass; without err only out.
        Floats out = mat, err(size_t(n * m), std::numeric_limits<float>::quiet_NaN());
        kernels::lowRankExpand(out.data(), err.data(), m, p.data(), q2T.data(), r, 0, n);
        const auto pAt = [&](int64_t i, int64_t k) { return p[size_t(i * r + k)]; };
        const auto qAt = [&](int64_t k, int64_t j) { return q2T[size_t(k * m + j)]; };
        checkProduct(out, n, m, r, pAt, qAt);
        checkProduct(err, n, m, r, pAt, qAt, &mat);
        Floats out2 = mat;
        kernels::lowRankExpand(out2.data(), nullptr, m, p.data(), q2T.data(), r, 0, n);
        REQUIRE(out2 == out);

        // 4. M += E fused with P = M Q: the sum stored back, P of the sum.
        const Floats e = randomFloats(size_t(n * m), 99);
        Floats fed = mat, p3(size_t(n * r));
        kernels::lowRankAddProject(fed.data(), e.data(), m, qT.data(), r, p3.data(), 0, n);
        for (size_t i = 0; i < fed.size(); ++i) REQUIRE(fed[i] == mat[i] + e[i]);
        checkProduct(
            p3, n, r, m, [&](int64_t i, int64_t t) { return fed[size_t(i * m + t)]; },
            [&](int64_t t, int64_t k) { return q[size_t(t * r + k)]; });
      }
    }
  }
}

TEST_CASE("low-rank results do not depend on how rows and columns are split", "[shm][kernels][lowrank]") {
  const int64_t n = 77, m = 203, r = 5;
  const Floats mat = randomFloats(size_t(n * m), 1);
  const Floats qT = randomFloats(size_t(r * m), 2);
  const Floats p = randomFloats(size_t(n * r), 3);
  Floats whole(size_t(n * r)), split(size_t(n * r));
  kernels::lowRankProject(mat.data(), m, qT.data(), r, whole.data(), 0, n);
  for (int64_t b = 0; b < n; b += 10)
    kernels::lowRankProject(mat.data(), m, qT.data(), r, split.data(), b, std::min(n, b + 10));
  REQUIRE(whole == split);

  Floats qWhole(size_t(r * m)), qSplit(size_t(r * m));
  kernels::lowRankProjectT(mat.data(), n, m, p.data(), r, qWhole.data(), 0, m);
  for (int64_t b = 0; b < m; b += 13)
    kernels::lowRankProjectT(mat.data(), n, m, p.data(), r, qSplit.data(), b, std::min(m, b + 13));
  REQUIRE(qWhole == qSplit);

  Floats o1 = mat, o2 = mat, e1(mat.size()), e2(mat.size());
  kernels::lowRankExpand(o1.data(), e1.data(), m, p.data(), qT.data(), r, 0, n);
  for (int64_t b = 0; b < n; b += 3)
    kernels::lowRankExpand(o2.data(), e2.data(), m, p.data(), qT.data(), r, b, std::min(n, b + 3));
  REQUIRE(o1 == o2);
  REQUIRE(e1 == e2);
}

TEST_CASE("the error is the same with and without streaming stores", "[shm][kernels][lowrank]") {
  // lowRankExpand streams the error out when every row of it is 32-byte aligned (AVX builds), and stores it
  // normally otherwise: the two paths must agree bit for bit, and the streamed error must be complete on return.
  const int64_t n = 9, m = 64, r = 2;
  const Floats mat = randomFloats(size_t(n * m), 21);
  const Floats qT = randomFloats(size_t(r * m), 22);
  const Floats p = randomFloats(size_t(n * r), 23);
  LevelReset reset;
  for (kernels::SimdLevel level : levelsToTest()) {
    kernels::forceSimdLevel(level);
    INFO("level " << kernels::simdLevelName(level));
    AlignedFloats buffer(size_t(n * m + 8));
    REQUIRE(reinterpret_cast<uintptr_t>(buffer.data()) % 64 == 0);
    Floats o1 = mat, o2 = mat;
    float* aligned = buffer.data();
    kernels::lowRankExpand(o1.data(), aligned, m, p.data(), qT.data(), r, 0, n);
    const Floats streamed(aligned, aligned + n * m);
    float* unaligned = buffer.data() + 1;  // rows 4 bytes off: normal stores
    kernels::lowRankExpand(o2.data(), unaligned, m, p.data(), qT.data(), r, 0, n);
    REQUIRE(o1 == o2);
    REQUIRE(streamed == Floats(unaligned, unaligned + n * m));
    for (int64_t i = 0; i < n * m; ++i) REQUIRE(streamed[size_t(i)] == mat[size_t(i)] - o1[size_t(i)]);
  }
}

TEST_CASE("Gram-Schmidt gives orthonormal columns; a zero column gives NaN", "[shm][kernels][lowrank]") {
  const int64_t rows = 41, r = 3;
  Floats x = randomFloats(size_t(rows * r), 5);
  kernels::lowRankGramSchmidt(x.data(), rows, r, 0.0f);
  for (int64_t a = 0; a < r; ++a) {
    for (int64_t b = 0; b < r; ++b) {
      double dot = 0.0;
      for (int64_t i = 0; i < rows; ++i) dot += double(x[size_t(i * r + a)]) * double(x[size_t(i * r + b)]);
      REQUIRE(std::fabs(dot - (a == b ? 1.0 : 0.0)) < 1e-5);
    }
  }
  Floats zero(size_t(rows), 0.0f);
  kernels::lowRankGramSchmidt(zero.data(), rows, 1, 0.0f);
  for (float v : zero) REQUIRE(std::isnan(v));
  Floats withEps(size_t(rows), 0.0f);
  kernels::lowRankGramSchmidt(withEps.data(), rows, 1, 1e-8f);  // epsilon: 0 / (0 + eps) = 0, no NaN
  for (float v : withEps) REQUIRE(v == 0.0f);
}

TEST_CASE("low-rank kernels reject bad shapes and ranges", "[shm][kernels][lowrank]") {
  Floats a(16), b(16), c(16);
  REQUIRE_THROWS_WITH(kernels::lowRankProject(a.data(), 0, b.data(), 1, c.data(), 0, 1),
                      Catch::Contains("lowRankProject: bad shape"));
  REQUIRE_THROWS_WITH(kernels::lowRankProjectT(a.data(), 4, 4, b.data(), 1, c.data(), 2, 5),
                      Catch::Contains("column range [2, 5) is outside [0, 4)"));
  REQUIRE_THROWS_WITH(kernels::lowRankAddProject(a.data(), nullptr, 4, b.data(), 1, c.data(), 0, 1),
                      Catch::Contains("error missing"));
  REQUIRE_THROWS_WITH(kernels::lowRankExpand(a.data(), nullptr, 4, b.data(), c.data(), 0, 0, 1),
                      Catch::Contains("lowRankExpand: bad shape"));
}
