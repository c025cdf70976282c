// fp16/bf16 compression of tensors (the kernels of compress_hook.cpp and low_precision_wrapper.cpp); see
// tunedist/hooks/kernels.h. CPU float32 tensors run the engine's fused one-pass kernels (kernels/compress.h: cast,
// divide, cast again, rounding as torch's hooks; in place without a second buffer); CUDA float32 tensors one fused
// pass of hooks/cuda when built with it (torch's CUDA rounding); other devices or layouts use ATen's copy_ and div_.
#include "tunedist/hooks/kernels.h"

#include <cstdint>

#include "hooks/common.h"
#include "hooks/cuda/cuda_kernels.h"
#include "kernels/compress.h"

namespace tunedist::hooks {
namespace {

void checkPair(const at::Tensor& lowp, const at::Tensor& wide, const char* op) {
  TORCH_CHECK(lowp.scalar_type() == at::kHalf || lowp.scalar_type() == at::kBFloat16, "tunedist.hooks.", op,
              ": the compressed tensor must be float16 or bfloat16, got ", lowp.scalar_type());
  TORCH_CHECK(lowp.numel() == wide.numel(), "tunedist.hooks.", op, ": sizes differ (", lowp.numel(), " vs ",
              wide.numel(), " elements)");
  TORCH_CHECK(lowp.device() == wide.device(), "tunedist.hooks.", op, ": tensors on different devices");
}

kernels::LowPrecision lowPrecision(at::ScalarType dtype) {
  return dtype == at::kHalf ? kernels::LowPrecision::kFloat16 : kernels::LowPrecision::kBFloat16;
}

// Whether the fused kernels handle this pair: CPU, contiguous, float32 on the wide side.
bool fusedPair(const at::Tensor& lowp, const at::Tensor& wide) {
  return cpuFloat(wide) && lowp.is_cpu() && lowp.is_contiguous();
}

}  // namespace

bool canCompressInPlace(const at::Tensor& buffer) { return cpuFloat(buffer) && buffer.dim() == 1; }

at::Tensor compressInPlace(at::Tensor& buffer, at::ScalarType dtype, int64_t divisor) {
  TORCH_CHECK(canCompressInPlace(buffer), "tunedist.hooks.compressInPlace: needs a contiguous 1-D CPU float32 tensor");
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16, "tunedist.hooks.compressInPlace: float16 or bfloat16");
  TORCH_CHECK(divisor > 0 && divisor <= INT32_MAX, "tunedist.hooks.compressInPlace: divisor must be in [1, 2^31), got ",
              divisor);
  const int64_t n = buffer.numel();
  at::Tensor view = buffer.view(dtype).narrow(0, 0, n);
  kernels::compressToLowPrecision(lowPrecision(dtype), view.data_ptr(), buffer.data_ptr(), static_cast<size_t>(n),
                                  static_cast<int>(divisor));
  return view;
}

void decompressInPlace(at::Tensor& buffer, const at::Tensor& view, const at::Tensor& reduced) {
  TORCH_CHECK(canCompressInPlace(buffer) && view.numel() == buffer.numel() && view.data_ptr() == buffer.data_ptr(),
              "tunedist.hooks.decompressInPlace: `view` is not the compressInPlace view of `buffer`");
  if (reduced.data_ptr() != view.data_ptr()) view.copy_(reduced);
  kernels::widenFromLowPrecision(lowPrecision(view.scalar_type()), buffer.data_ptr(), view.data_ptr(),
                                 static_cast<size_t>(buffer.numel()));
}

void compressInto(at::Tensor& dst, const at::Tensor& src, int64_t divisor) {
  checkPair(dst, src, "compressInto");
  TORCH_CHECK(divisor > 0 && divisor <= INT32_MAX, "tunedist.hooks.compressInto: divisor must be in [1, 2^31), got ",
              divisor);
  if (fusedPair(dst, src)) {
    kernels::compressToLowPrecision(lowPrecision(dst.scalar_type()), dst.data_ptr(), src.data_ptr(),
                                    static_cast<size_t>(src.numel()), static_cast<int>(divisor));
    return;
  }
  if (cuda::compressInto(dst, src, divisor)) return;  // CUDA: one fused pass (hooks/cuda)
  dst.copy_(src.view_as(dst));
  if (divisor != 1) dst.div_(divisor);
}

void decompressInto(at::Tensor& dst, const at::Tensor& src) {
  checkPair(src, dst, "decompressInto");
  if (fusedPair(src, dst)) {
    kernels::widenFromLowPrecision(lowPrecision(src.scalar_type()), dst.data_ptr(), src.data_ptr(),
                                   static_cast<size_t>(src.numel()));
    return;
  }
  dst.copy_(src.view_as(dst));
}

}  // namespace tunedist::hooks
