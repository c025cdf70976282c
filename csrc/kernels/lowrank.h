// Low-rank (PowerSGD) kernels on row-major float32 matrices, for the DDP hooks (csrc/hooks/powersgd/).
// A gradient M (rows x cols) is approximated by P Q^T with P (rows x r) and Q (cols x r), r small (1-32 in
// practice). BLAS is slow at this shape: MKL's sgemm at r = 2..4 runs 4-5x below the memory bandwidth that a
// product reading M once reaches. Each kernel reads M once, and the decompression writes M and its error feedback
// in the same pass.
//
// The caller splits rows (or columns, for projectT) over threads: every output element is computed by one call in
// a fixed order, so results do not depend on the split. They do depend on the SIMD level: the AVX2 build uses FMA
// and 8 partial sums per dot product, the portable one neither, so levels agree to float rounding, not bit for bit.
// Q is passed transposed (qT: r x cols, row-major), the layout the inner loops read contiguously.
#pragma once

#include <cstdint>

namespace tunedist::kernels {

// p[i][k] = sum_j m[i][j] * qT[k][j], for rows i in [rowBegin, rowEnd) and k < r.
void lowRankProject(const float* m, int64_t cols, const float* qT, int64_t r, float* p, int64_t rowBegin,
                    int64_t rowEnd);
// m[i][j] += err[i][j], then lowRankProject, in one pass over m (PowerSGD's error feedback fused with P = M Q).
void lowRankAddProject(float* m, const float* err, int64_t cols, const float* qT, int64_t r, float* p, int64_t rowBegin,
                       int64_t rowEnd);

// qT[k][j] = sum_i m[i][j] * p[i][k] (i ascending), for columns j in [colBegin, colEnd) and k < r: Q = M^T P,
// written transposed.
void lowRankProjectT(const float* m, int64_t rows, int64_t cols, const float* p, int64_t r, float* qT, int64_t colBegin,
                     int64_t colEnd);

// For rows i in [rowBegin, rowEnd): v[j] = sum_k p[i][k] * qT[k][j] (k ascending; at r = 1 the one rounded product
// p[i][0] * qT[0][j], which is what BLAS computes); if err is not null, err[i][j] = out[i][j] - v[j] (out's old
// value: the error-fed gradient); then out[i][j] = v[j].
void lowRankExpand(float* out, float* err, int64_t cols, const float* p, const float* qT, int64_t r, int64_t rowBegin,
                   int64_t rowEnd);

// Gram-Schmidt on the columns of x (rows x r, row-major), in place, as torch's PowerSGD orthogonalisation: column
// by column, 1. divide it by its 2-norm (plus epsilon when epsilon != 0; a zero column then gives NaN or inf as
// torch's does), 2. subtract its projection from every later column. Norms and projections sum in double.
void lowRankGramSchmidt(float* x, int64_t rows, int64_t r, float epsilon);

// dst (cols x rows) = src (rows x cols) transposed.
void transposeFloat(float* dst, const float* src, int64_t rows, int64_t cols);

}  // namespace tunedist::kernels
