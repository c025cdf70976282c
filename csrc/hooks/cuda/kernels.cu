// The hooks' CUDA kernels (launch.h): fused elementwise passes that save a read and a write of the bucket over
// ATen's two-op sequences (cast then divide; add then copy). Grid-stride loops, 16-byte loads where the pointers
// allow, scalar loops otherwise; the arithmetic per element is the same in both, so results do not depend on the
// alignment.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "hooks/cuda/launch.h"

namespace tunedist::hooks::cuda::launch {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU several times over; the grid-stride loops cover the rest.
constexpr int64_t kMaxBlocks = 8192;

int blocksFor(int64_t items) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(kMaxBlocks, (items + kThreads - 1) / kThreads)));
}

__device__ __forceinline__ float roundLow(float x, bool bf16) {
  return bf16 ? __bfloat162float(__float2bfloat16_rn(x)) : __half2float(__float2half_rn(x));
}

// The 16 bits of low(x), as stored.
__device__ __forceinline__ uint16_t lowBits(float x, bool bf16) {
  if (bf16) {
    const __nv_bfloat16 b = __float2bfloat16_rn(x);
    return *reinterpret_cast<const uint16_t*>(&b);
  }
  const __half h = __float2half_rn(x);
  return *reinterpret_cast<const uint16_t*>(&h);
}

__device__ __forceinline__ uint16_t compressOne(float x, float scale, bool bf16) {
  return lowBits(roundLow(x, bf16) * scale, bf16);
}

// Four elements per step: one 16-byte load, one 8-byte store.
__global__ void compressVec4(uint2* __restrict__ dst, const float4* __restrict__ src, int64_t quads, float scale,
                             bool bf16) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < quads; i += int64_t(gridDim.x) * blockDim.x) {
    const float4 v = src[i];
    const uint32_t lo = compressOne(v.x, scale, bf16) | (uint32_t(compressOne(v.y, scale, bf16)) << 16);
    const uint32_t hi = compressOne(v.z, scale, bf16) | (uint32_t(compressOne(v.w, scale, bf16)) << 16);
    dst[i] = make_uint2(lo, hi);
  }
}

__global__ void compressScalar(uint16_t* __restrict__ dst, const float* __restrict__ src, int64_t n, float scale,
                               bool bf16) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = compressOne(src[i], scale, bf16);
  }
}

__global__ void addAndRememberVec4(float4* __restrict__ input, float4* __restrict__ error, int64_t quads) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < quads; i += int64_t(gridDim.x) * blockDim.x) {
    float4 a = input[i];
    const float4 b = error[i];
    a.x += b.x;
    a.y += b.y;
    a.z += b.z;
    a.w += b.w;
    input[i] = a;
    error[i] = a;
  }
}

__global__ void addAndRememberScalar(float* __restrict__ input, float* __restrict__ error, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float sum = input[i] + error[i];
    input[i] = sum;
    error[i] = sum;
  }
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

const char* lastError() {
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace

const char* compressLowPrecision(void* dst, const float* src, int64_t n, float scale, bool bf16, void* stream) {
  if (n <= 0) return nullptr;
  auto s = static_cast<cudaStream_t>(stream);
  auto* out = static_cast<uint16_t*>(dst);
  int64_t done = 0;
  if (aligned(src, 16) && aligned(dst, 8) && n >= 4) {
    const int64_t quads = n / 4;
    compressVec4<<<blocksFor(quads), kThreads, 0, s>>>(reinterpret_cast<uint2*>(out),
                                                       reinterpret_cast<const float4*>(src), quads, scale, bf16);
    done = quads * 4;
  }
  if (done < n) compressScalar<<<blocksFor(n - done), kThreads, 0, s>>>(out + done, src + done, n - done, scale, bf16);
  return lastError();
}

const char* addAndRemember(float* input, float* error, int64_t n, void* stream) {
  if (n <= 0) return nullptr;
  auto s = static_cast<cudaStream_t>(stream);
  int64_t done = 0;
  if (aligned(input, 16) && aligned(error, 16) && n >= 4) {
    const int64_t quads = n / 4;
    addAndRememberVec4<<<blocksFor(quads), kThreads, 0, s>>>(reinterpret_cast<float4*>(input),
                                                             reinterpret_cast<float4*>(error), quads);
    done = quads * 4;
  }
  if (done < n) addAndRememberScalar<<<blocksFor(n - done), kThreads, 0, s>>>(input + done, error + done, n - done);
  return lastError();
}

}  // namespace tunedist::hooks::cuda::launch
