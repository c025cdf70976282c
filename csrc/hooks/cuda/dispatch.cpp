// Dispatch of the hooks' CUDA kernels (cuda_kernels.h): checks that the tensors suit a kernel, then launches it on
// torch's current stream of their device. Compiled only with TUNEDIST_CUDA_KERNELS (cmake/tunedistCudaKernels.cmake).
#include "hooks/cuda/cuda_kernels.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "hooks/cuda/launch.h"

namespace tunedist::hooks::cuda {
namespace {

bool sameCudaLayout(const at::Tensor& a, const at::Tensor& b) {
  return a.is_cuda() && b.is_cuda() && a.device() == b.device() && a.is_contiguous() && b.is_contiguous() &&
         a.numel() == b.numel();
}

void check(const char* error, const char* op, const at::Tensor& t) {
  TORCH_CHECK(error == nullptr, "tunedist.hooks.", op, ": CUDA kernel launch failed on ", t.device(), " (", t.numel(),
              " elements): ", error);
}

}  // namespace

bool compressInto(at::Tensor& dst, const at::Tensor& src, int64_t divisor) {
  const auto low = dst.scalar_type();
  if (!sameCudaLayout(dst, src) || src.scalar_type() != at::kFloat || (low != at::kHalf && low != at::kBFloat16)) {
    return false;
  }
  const c10::cuda::CUDAGuard guard(src.device());
  const float scale = 1.0f / static_cast<float>(divisor);  // torch's div_ by a CPU scalar: times its reciprocal
  check(launch::compressLowPrecision(dst.data_ptr(), src.data_ptr<float>(), src.numel(), scale, low == at::kBFloat16,
                                     c10::cuda::getCurrentCUDAStream(src.device().index()).stream()),
        "compressInto", src);
  return true;
}

bool addAndRemember(at::Tensor& input, at::Tensor& error) {
  if (!sameCudaLayout(input, error) || input.scalar_type() != at::kFloat || error.scalar_type() != at::kFloat) {
    return false;
  }
  const c10::cuda::CUDAGuard guard(input.device());
  check(launch::addAndRemember(input.data_ptr<float>(), error.data_ptr<float>(), input.numel(),
                               c10::cuda::getCurrentCUDAStream(input.device().index()).stream()),
        "addAndRemember", input);
  return true;
}

}  // namespace tunedist::hooks::cuda
