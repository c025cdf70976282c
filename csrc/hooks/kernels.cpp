// Compression kernels; see tunedist/hooks/kernels.h. Conversions and divisions are ATen's own (vectorised, and
// rounding exactly as torch's hooks do); what is ours is where they run: in place, without a second buffer.
#include "tunedist/hooks/kernels.h"


#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>


namespace tunedist::hooks {
namespace {

void checkPair(const at::Tensor& lowp, const at::Tensor& wide, const char* op) {
  TORCH_CHECK(lowp.scalar_type() == at::kHalf || lowp.scalar_type() == at::kBFloat16, "tunedist.hooks.", op,
              ": the compressed tensor must be float16 or bfloat16, got ", lowp.scalar_type());
  TORCH_CHECK(lowp.numel() == wide.numel(), "tunedist.hooks.", op, ": sizes differ (", lowp.numel(), " vs ",
              wide.numel(), " elements)");
  TORCH_CHECK(lowp.device() == wide.device(), "tunedist.hooks.", op, ": tensors on different devices");
}

// In place, by doubling chunks: elements [a, b) are read from bytes [4a, 4b) (float32) and written to bytes
// [2a, 2b) (16-bit); the two ranges do not overlap when b <= 2a. So after element 0 the chunks [1, 2), [2, 4),
// [4, 8), ... each convert with one vectorised ATen copy, and compressing them in increasing order only overwrites
// floats an earlier chunk has read. Widening runs the same chunks in decreasing order.
template <typename Fn>
void forEachChunk(int64_t n, bool increasing, Fn fn) {
  std::vector<std::pair<int64_t, int64_t>> chunks;
  for (int64_t a = 1; a < n; a *= 2) chunks.emplace_back(a, std::min(2 * a, n));
  if (!increasing) std::reverse(chunks.begin(), chunks.end());
  for (auto [a, b] : chunks) fn(a, b - a);
}

}  // namespace

bool canCompressInPlace(const at::Tensor& buffer) {
  return buffer.is_cpu() && buffer.scalar_type() == at::kFloat && buffer.is_contiguous() && buffer.dim() == 1;
}

at::Tensor compressInPlace(at::Tensor& buffer, at::ScalarType dtype, int64_t divisor) {
  TORCH_CHECK(canCompressInPlace(buffer), "tunedist.hooks.compressInPlace: needs a contiguous 1-D CPU float32 tensor");
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16, "tunedist.hooks.compressInPlace: float16 or bfloat16");
  TORCH_CHECK(divisor > 0, "tunedist.hooks.compressInPlace: divisor must be positive, got ", divisor);
  const int64_t n = buffer.numel();
  at::Tensor view = buffer.view(dtype).narrow(0, 0, n);
  if (n == 0) return view;
  // Element 0 shares its bytes with its own result: through a temporary.
  view.narrow(0, 0, 1).copy_(buffer.narrow(0, 0, 1).clone());
  forEachChunk(n, true, [&](int64_t a, int64_t len) { view.narrow(0, a, len).copy_(buffer.narrow(0, a, len)); });
  // The division in the low precision, as torch's `to(dtype).div_(size)`.
  view.div_(divisor);
  return view;
}

void decompressInPlace(at::Tensor& buffer, const at::Tensor& view, const at::Tensor& reduced) {
  TORCH_CHECK(canCompressInPlace(buffer) && view.numel() == buffer.numel() && view.data_ptr() == buffer.data_ptr(),
              "tunedist.hooks.decompressInPlace: `view` is not the compressInPlace view of `buffer`");
  if (reduced.data_ptr() != view.data_ptr()) view.copy_(reduced);
  const int64_t n = buffer.numel();
  if (n == 0) return;
  forEachChunk(n, false, [&](int64_t a, int64_t len) { buffer.narrow(0, a, len).copy_(view.narrow(0, a, len)); });
  buffer.narrow(0, 0, 1).copy_(view.narrow(0, 0, 1).clone());
}

void compressInto(at::Tensor& dst, const at::Tensor& src, int64_t divisor) {
  checkPair(dst, src, "compressInto");
  TORCH_CHECK(divisor > 0, "tunedist.hooks.compressInto: divisor must be positive, got ", divisor);
  dst.copy_(src.view_as(dst));
  if (divisor != 1) dst.div_(divisor);
}

void decompressInto(at::Tensor& dst, const at::Tensor& src) {
  checkPair(src, dst, "decompressInto");
  dst.copy_(src.view_as(dst));
}

bool shouldCompress(int64_t n, int64_t m, int64_t rank, double minCompressionRate) {
  return static_cast<double>((n + m) * rank) * minCompressionRate < static_cast<double>(n * m);
}

}  // namespace tunedist::hooks
