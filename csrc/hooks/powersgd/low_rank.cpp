// PowerSGD's matrix products (tunedist/hooks/kernels.h, low_rank.h): our low-rank kernels (kernels/lowrank.h) on
// contiguous CPU float32 tensors, ATen's mm elsewhere. Rows (or, for M^T P, columns) are split over ATen's intra-op
// threads; each output element is computed by one thread, so the split never changes a result.
#include "hooks/powersgd/low_rank.h"

#include <ATen/Parallel.h>

#include <vector>

#include "hooks/common.h"
#include "kernels/lowrank.h"
#include "tunedist/hooks/kernels.h"

namespace tunedist::hooks {
namespace {

// Elements of M per parallel chunk.
constexpr int64_t kGrainElements = int64_t{1} << 16;

// Q transposed (r x m), in a per-thread buffer: hooks of different buckets may run at once on different threads.
float* transposedScratch(int64_t elements) {
  thread_local std::vector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < elements) scratch.resize(static_cast<size_t>(elements));
  return scratch.data();
}

void checkShapes(const char* what, const at::Tensor& matrix, const at::Tensor& p, const at::Tensor& q) {
  TORCH_CHECK(matrix.dim() == 2 && p.dim() == 2 && q.dim() == 2 && p.size(0) == matrix.size(0) &&
                  q.size(0) == matrix.size(1) && p.size(1) == q.size(1),
              "tunedist.hooks.", what, ": expects M (n, m), P (n, r) and Q (m, r); got ", matrix.sizes(), ", ",
              p.sizes(), " and ", q.sizes());
}

}  // namespace

bool lowRankNative(const at::Tensor& matrix, const at::Tensor& p, const at::Tensor& q) {
  return cpuFloat(matrix) && cpuFloat(p) && cpuFloat(q) && matrix.numel() > 0 && p.size(-1) > 0;
}

namespace {

// p = M q, with M += error first (same pass) when error is defined.
void project(const at::Tensor& matrix, const at::Tensor& error, const at::Tensor& q, at::Tensor& p) {
  const int64_t n = matrix.size(0), m = matrix.size(1), r = q.size(1);
  float* qT = transposedScratch(r * m);
  kernels::transposeFloat(qT, q.data_ptr<float>(), m, r);
  float* mat = matrix.data_ptr<float>();
  const float* err = error.defined() ? error.data_ptr<float>() : nullptr;
  float* out = p.data_ptr<float>();
  at::parallel_for(0, n, std::max<int64_t>(1, kGrainElements / m), [&](int64_t begin, int64_t end) {
    if (err != nullptr) {
      kernels::lowRankAddProject(mat, err, m, qT, r, out, begin, end);
    } else {
      kernels::lowRankProject(mat, m, qT, r, out, begin, end);
    }
  });
}

}  // namespace

void multiplyMQ(const at::Tensor& matrix, const at::Tensor& q, at::Tensor& p) {
  checkShapes("multiplyMQ", matrix, p, q);
  if (!lowRankNative(matrix, p, q)) {
    at::mm_out(p, matrix, q);
    return;
  }
  project(matrix, at::Tensor(), q, p);
}

void addErrorAndMultiplyMQ(at::Tensor& matrix, const at::Tensor& error, const at::Tensor& q, at::Tensor& p) {
  checkShapes("addErrorAndMultiplyMQ", matrix, p, q);
  TORCH_CHECK(error.numel() == matrix.numel() && error.scalar_type() == matrix.scalar_type(),
              "tunedist.hooks.addErrorAndMultiplyMQ: the error has ", error.numel(), " elements of ",
              error.scalar_type(), ", the matrix ", matrix.numel(), " of ", matrix.scalar_type());
  if (!lowRankNative(matrix, p, q) || !cpuFloat(error)) {
    matrix.add_(error.view_as(matrix));
    at::mm_out(p, matrix, q);
    return;
  }
  project(matrix, error, q, p);
}

void multiplyMtP(const at::Tensor& matrix, const at::Tensor& p, at::Tensor& q) {
  checkShapes("multiplyMtP", matrix, p, q);
  if (!lowRankNative(matrix, p, q)) {
    at::mm_out(q, matrix.t(), p);
    return;
  }
  const int64_t n = matrix.size(0), m = matrix.size(1), r = p.size(1);
  float* qT = transposedScratch(r * m);
  const float* mat = matrix.data_ptr<float>();
  const float* pv = p.data_ptr<float>();
  at::parallel_for(0, m, std::max<int64_t>(8, kGrainElements / n),
                   [&](int64_t begin, int64_t end) { kernels::lowRankProjectT(mat, n, m, pv, r, qT, begin, end); });
  kernels::transposeFloat(q.data_ptr<float>(), qT, r, m);
}

void writePQt(at::Tensor& out, const at::Tensor& p, const at::Tensor& q, const at::Tensor& errorSlice) {
  checkShapes("writePQt", out, p, q);
  const bool withError = errorSlice.defined();
  if (!lowRankNative(out, p, q) || (withError && (!cpuFloat(errorSlice) || errorSlice.numel() != out.numel()))) {
    TORCH_CHECK(!withError,
                "tunedist.hooks.writePQt: the error slice needs contiguous CPU float32 tensors of the "
                "output's size");
    at::mm_out(out, p, q.t());
    return;
  }
  const int64_t n = out.size(0), m = out.size(1), r = q.size(1);
  float* qT = transposedScratch(r * m);
  kernels::transposeFloat(qT, q.data_ptr<float>(), m, r);
  float* o = out.data_ptr<float>();
  float* e = withError ? errorSlice.data_ptr<float>() : nullptr;
  const float* pv = p.data_ptr<float>();
  at::parallel_for(0, n, std::max<int64_t>(1, kGrainElements / m),
                   [&](int64_t begin, int64_t end) { kernels::lowRankExpand(o, e, m, pv, qT, r, begin, end); });
}

}  // namespace tunedist::hooks
