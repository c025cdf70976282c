// Dispatch and argument checks of the low-rank kernels (lowrank.h); Gram-Schmidt and the transpose, which touch
// only rows x r floats, are plain loops here.
#include "kernels/lowrank.h"

#include <cmath>

#include "core/error.h"
#include "kernels/lowrank_table_impl.h"
#include "kernels/reduce.h"

namespace tunedist::kernels {
namespace {

const kernels::LowRankTable& table() {
  // The AVX2 build also needs FMA; AVX-512 machines run it too (the rows of a gradient are short).
  static const bool kFma = __builtin_cpu_supports("fma") != 0;
  return activeSimdLevel() != SimdLevel::kScalar && kFma ? avx2::kLowRankTable : scalar::kLowRankTable;
}

void checkRange(const char* op, int64_t begin, int64_t end, int64_t limit, const char* what) {
  TD_CHECK(0 <= begin && begin <= end && end <= limit, op, ": ", what, " range [", begin, ", ", end,
           ") is outside [0, ", limit, ")");
}

}  // namespace

void lowRankProject(const float* m, int64_t cols, const float* qT, int64_t r, float* p, int64_t rowBegin,
                    int64_t rowEnd) {
  TD_CHECK(cols > 0 && r > 0 && 0 <= rowBegin && rowBegin <= rowEnd, "lowRankProject: bad shape (cols ", cols, ", r ",
           r, ", rows [", rowBegin, ", ", rowEnd, "))");
  if (rowBegin == rowEnd) return;
  // Without an error to add, the kernel does not write m.
  table().project(const_cast<float*>(m), nullptr, cols, qT, r, p, rowBegin, rowEnd);
}

void lowRankAddProject(float* m, const float* err, int64_t cols, const float* qT, int64_t r, float* p, int64_t rowBegin,
                       int64_t rowEnd) {
  TD_CHECK(cols > 0 && r > 0 && 0 <= rowBegin && rowBegin <= rowEnd && err != nullptr,
           "lowRankAddProject: bad arguments (cols ", cols, ", r ", r, ", rows [", rowBegin, ", ", rowEnd, "), error ",
           err == nullptr ? "missing" : "given", ")");
  if (rowBegin == rowEnd) return;
  table().project(m, err, cols, qT, r, p, rowBegin, rowEnd);
}

void lowRankProjectT(const float* m, int64_t rows, int64_t cols, const float* p, int64_t r, float* qT, int64_t colBegin,
                     int64_t colEnd) {
  TD_CHECK(rows > 0 && cols > 0 && r > 0, "lowRankProjectT: bad shape (rows ", rows, ", cols ", cols, ", r ", r, ")");
  checkRange("lowRankProjectT", colBegin, colEnd, cols, "column");
  if (colBegin == colEnd) return;
  table().projectT(m, rows, cols, p, r, qT, colBegin, colEnd);
}

void lowRankExpand(float* out, float* err, int64_t cols, const float* p, const float* qT, int64_t r, int64_t rowBegin,
                   int64_t rowEnd) {
  TD_CHECK(cols > 0 && r > 0 && 0 <= rowBegin && rowBegin <= rowEnd, "lowRankExpand: bad shape (cols ", cols, ", r ", r,
           ", rows [", rowBegin, ", ", rowEnd, "))");
  if (rowBegin == rowEnd) return;
  table().expand(out, err, cols, p, qT, r, rowBegin, rowEnd);
}

void lowRankGramSchmidt(float* x, int64_t rows, int64_t r, float epsilon) {
  TD_CHECK(rows >= 0 && r >= 0, "lowRankGramSchmidt: bad shape (rows ", rows, ", r ", r, ")");
  for (int64_t c = 0; c < r; ++c) {
    // 1. Normalise column c.
    double sq = 0.0;
    for (int64_t i = 0; i < rows; ++i) sq += double(x[i * r + c]) * double(x[i * r + c]);
    const float norm = static_cast<float>(std::sqrt(sq));
    const float divisor = epsilon == 0.0f ? norm : norm + epsilon;
    for (int64_t i = 0; i < rows; ++i) x[i * r + c] /= divisor;
    // 2. Remove its direction from the later columns.
    for (int64_t l = c + 1; l < r; ++l) {
      double dot = 0.0;
      for (int64_t i = 0; i < rows; ++i) dot += double(x[i * r + c]) * double(x[i * r + l]);
      const float d = static_cast<float>(dot);
      for (int64_t i = 0; i < rows; ++i) x[i * r + l] -= d * x[i * r + c];
    }
  }
}

void transposeFloat(float* dst, const float* src, int64_t rows, int64_t cols) {
  TD_CHECK(rows >= 0 && cols >= 0 && dst != src, "transposeFloat: bad arguments (rows ", rows, ", cols ", cols, ")");
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[j * rows + i] = src[i * cols + j];
}

}  // namespace tunedist::kernels
