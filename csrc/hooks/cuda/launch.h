// The hooks' CUDA kernels (kernels.cu), as plain launchers: no torch types cross this line, so kernels.cu builds
// with nvcc alone and dispatch.cpp (C++ against torch's headers) calls them on torch's current stream. Each
// launcher returns nullptr when the launch went through, else the CUDA runtime's error text.
#pragma once

#include <cstdint>

namespace tunedist::hooks::cuda::launch {

// dst[i] = low(low(src[i]) * scale), low = round to nearest even float16 (bf16 false) or bfloat16 (bf16 true), the
// product in float: torch's CUDA `src.to(dtype).div_(d)`, which multiplies by the float reciprocal scale = 1.0f / d
// (a CPU scalar divisor). scale 1 is the plain cast. One pass: read float32, write 16 bits.
const char* compressLowPrecision(void* dst, const float* src, int64_t n, float scale, bool bf16, void* stream);

// input[i] += error[i]; error[i] = input[i] (PowerSGD's error feedback and the copy it keeps). One pass over both.
const char* addAndRemember(float* input, float* error, int64_t n, void* stream);

}  // namespace tunedist::hooks::cuda::launch
