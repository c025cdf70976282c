// The hooks' CUDA kernels seen from C++ (dispatch.cpp; the kernels are in kernels.cu). Each function takes the
// fused path when this build has the kernels (TUNEDIST_CUDA_KERNELS) and the tensors suit it, and returns whether
// it did; the caller falls back to ATen's ops otherwise. Kernels run on torch's current stream of the tensors'
// device, as ATen's ops would.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace tunedist::hooks::cuda {

#if defined(TUNEDIST_WITH_CUDA_KERNELS)
constexpr bool kBuilt = true;
// dst = torch's CUDA `src.to(dst.dtype).div_(divisor)` bit for bit, in one pass: dst fp16/bf16, src fp32, both
// contiguous CUDA tensors of the same device and numel.
bool compressInto(at::Tensor& dst, const at::Tensor& src, int64_t divisor);
// input += error; error = input, in one pass: both contiguous float32 CUDA tensors of the same device and numel.
bool addAndRemember(at::Tensor& input, at::Tensor& error);
#else
constexpr bool kBuilt = false;
inline bool compressInto(at::Tensor&, const at::Tensor&, int64_t) { return false; }
inline bool addAndRemember(at::Tensor&, at::Tensor&) { return false; }
#endif

}  // namespace tunedist::hooks::cuda
