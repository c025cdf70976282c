// PowerSGD's orthogonalisation of a batch of low-rank matrices (B, rows, r); see tunedist/hooks/kernels.h.
// Gram-Schmidt on contiguous CPU float32 runs our loop (kernels/lowrank.h: no per-column ATen calls, sums in
// double), which agrees with torch's to float rounding; elsewhere the operation sequence is torch's (same ATen ops
// in the same order), bit for bit.
#include <ATen/ATen.h>

#include "hooks/common.h"
#include "kernels/lowrank.h"
#include "tunedist/hooks/kernels.h"

namespace tunedist::hooks {
namespace {

// Column by column: 1. normalise column i (divide by its 2-norm, + epsilon if non-zero);
// 2. subtract its projection from every later column.
void gramSchmidt(at::Tensor& matrices, double epsilon) {
  const int64_t cols = matrices.size(2);
  for (int64_t i = 0; i < cols; ++i) {
    at::Tensor col = matrices.narrow(2, i, 1);
    at::Tensor norm = at::linalg_vector_norm(col, 2, at::IntArrayRef{1}, /*keepdim=*/true, std::nullopt);
    if (epsilon == 0) {
      col.div_(norm);
    } else {
      col.div_(norm + epsilon);
    }
    if (i + 1 < cols) {
      at::Tensor rest = matrices.narrow(2, i + 1, cols - i - 1);
      rest.sub_(at::sum(col * rest, at::IntArrayRef{1}, /*keepdim=*/true) * col);
    }
  }
}

}  // namespace

void orthogonalize(at::Tensor& matrices, double epsilon) {
  TORCH_CHECK(matrices.dim() == 3 && matrices.size(2) <= matrices.size(1),
              "tunedist.hooks.orthogonalize: expects a batch of matrices (B, rows, r) with r <= rows, got shape ",
              matrices.sizes());
  const int64_t rank = matrices.size(2);
  const auto dtype = matrices.scalar_type();
  if (rank <= 2 || dtype == at::kHalf || dtype == at::kBFloat16) {
    if (cpuFloat(matrices)) {
      float* base = matrices.data_ptr<float>();
      const int64_t rows = matrices.size(1);
      for (int64_t b = 0; b < matrices.size(0); ++b) {
        kernels::lowRankGramSchmidt(base + b * rows * rank, rows, rank, static_cast<float>(epsilon));
      }
      return;
    }
    gramSchmidt(matrices, epsilon);
    return;
  }
  at::Tensor r = at::empty({matrices.size(0), rank, rank}, matrices.options());
  at::linalg_qr_out(matrices, r, matrices, "reduced");
}

}  // namespace tunedist::hooks
