// Compression kernels; see tunedist/hooks/kernels.h. The fp32 <-> fp16/bf16 element conversions are the engine's
// (shm/kernels/convert_impl.h: exact, round to nearest even, NaN-preserving, branch-free so they vectorise).
#include "tunedist/hooks/kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

#include "shm/kernels/convert_impl.h"

namespace tunedist::hooks {
namespace {

using shm::kernels::bf16ToFloat;
using shm::kernels::floatToBf16;
using shm::kernels::floatToHalf;
using shm::kernels::halfToFloat;

// Elements per parallel task: large enough that a task outlives its scheduling cost.
constexpr int64_t kGrain = 1 << 15;

void checkPair(const at::Tensor& lowp, const at::Tensor& wide, const char* op) {
  TORCH_CHECK(lowp.scalar_type() == at::kHalf || lowp.scalar_type() == at::kBFloat16, "tunedist.hooks.", op,
              ": the compressed tensor must be float16 or bfloat16, got ", lowp.scalar_type());
  TORCH_CHECK(lowp.numel() == wide.numel(), "tunedist.hooks.", op, ": sizes differ (", lowp.numel(), " vs ",
              wide.numel(), " elements)");
  TORCH_CHECK(lowp.device() == wide.device(), "tunedist.hooks.", op, ": tensors on different devices");
}

bool fusedCpuPath(const at::Tensor& lowp, const at::Tensor& wide) {
  return lowp.is_cpu() && wide.is_cpu() && wide.scalar_type() == at::kFloat && lowp.is_contiguous() &&
         wide.is_contiguous();
}

// out[i] = narrow(narrow(in[i]) / d): the first rounding is the cast, the second the low-precision division
// (computed in fp32 and rounded once, as ATen's Half/BFloat16 division is).
template <uint16_t (*Narrow)(float), float (*Widen)(uint16_t)>
void compressLoop(uint16_t* out, const float* in, int64_t n, float d) {
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = Narrow(Widen(Narrow(in[i])) / d);
  });
}

template <float (*Widen)(uint16_t)>
void decompressLoop(float* out, const uint16_t* in, int64_t n) {
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = Widen(in[i]);
  });
}

// In-place blocks: elements per block of compressInPlace/decompressInPlace, staged through local arrays (memcpy,
// so no pointer of one type reads bytes written through another).
constexpr int64_t kBlock = 1024;

// Forward over blocks: block k writes bytes [2kB, 2(k+1)B), which hold floats [kB/2, (k+1)B/2): for k >= 1 all
// read by earlier blocks, for k = 0 read by this block before it writes.
template <uint16_t (*Narrow)(float), float (*Widen)(uint16_t)>
void compressBlocks(char* bytes, int64_t n, float d) {
  float in[kBlock];
  uint16_t out[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t len = std::min(kBlock, n - b);
    std::memcpy(in, bytes + 4 * b, 4 * len);
    for (int64_t i = 0; i < len; ++i) out[i] = Narrow(Widen(Narrow(in[i])) / d);
    std::memcpy(bytes + 2 * b, out, 2 * len);
  }
}

// Backward over blocks: block k writes bytes [4kB, 4(k+1)B), which hold halves [2kB, 2(k+1)B): for k >= 1 all at
// or after block k+1, already widened; for k = 0 read by this block before it writes.
template <float (*Widen)(uint16_t)>
void decompressBlocks(char* bytes, int64_t n) {
  uint16_t in[kBlock];
  float out[kBlock];
  for (int64_t b = ((n - 1) / kBlock) * kBlock; b >= 0; b -= kBlock) {
    const int64_t len = std::min(kBlock, n - b);
    std::memcpy(in, bytes + 2 * b, 2 * len);
    for (int64_t i = 0; i < len; ++i) out[i] = Widen(in[i]);
    std::memcpy(bytes + 4 * b, out, 4 * len);
  }
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
  auto* bytes = static_cast<char*>(buffer.data_ptr());
  if (dtype == at::kHalf) {
    compressBlocks<floatToHalf, halfToFloat>(bytes, n, static_cast<float>(divisor));
  } else {
    compressBlocks<floatToBf16, bf16ToFloat>(bytes, n, static_cast<float>(divisor));
  }
  return buffer.view(dtype).narrow(0, 0, n);
}

void decompressInPlace(at::Tensor& buffer, const at::Tensor& view, const at::Tensor& reduced) {
  TORCH_CHECK(canCompressInPlace(buffer) && view.numel() == buffer.numel() && view.data_ptr() == buffer.data_ptr(),
              "tunedist.hooks.decompressInPlace: `view` is not the compressInPlace view of `buffer`");
  if (reduced.data_ptr() != view.data_ptr()) view.copy_(reduced);
  if (buffer.numel() == 0) return;
  auto* bytes = static_cast<char*>(buffer.data_ptr());
  if (view.scalar_type() == at::kHalf) {
    decompressBlocks<halfToFloat>(bytes, buffer.numel());
  } else {
    decompressBlocks<bf16ToFloat>(bytes, buffer.numel());
  }
}

void compressInto(at::Tensor& dst, const at::Tensor& src, int64_t divisor) {
  checkPair(dst, src, "compressInto");
  TORCH_CHECK(divisor > 0, "tunedist.hooks.compressInto: divisor must be positive, got ", divisor);
  if (!fusedCpuPath(dst, src)) {
    dst.copy_(src);
    dst.div_(divisor);
    return;
  }
  auto* out = reinterpret_cast<uint16_t*>(dst.data_ptr());
  const float* in = src.const_data_ptr<float>();
  const float d = static_cast<float>(divisor);
  if (dst.scalar_type() == at::kHalf) {
    compressLoop<floatToHalf, halfToFloat>(out, in, src.numel(), d);
  } else {
    compressLoop<floatToBf16, bf16ToFloat>(out, in, src.numel(), d);
  }
}

void decompressInto(at::Tensor& dst, const at::Tensor& src) {
  checkPair(src, dst, "decompressInto");
  if (!fusedCpuPath(src, dst)) {
    dst.copy_(src);
    return;
  }
  float* out = dst.data_ptr<float>();
  const auto* in = reinterpret_cast<const uint16_t*>(src.const_data_ptr());
  if (src.scalar_type() == at::kHalf) {
    decompressLoop<halfToFloat>(out, in, src.numel());
  } else {
    decompressLoop<bf16ToFloat>(out, in, src.numel());
  }
}

bool shouldCompress(int64_t n, int64_t m, int64_t rank, double minCompressionRate) {
  return static_cast<double>((n + m) * rank) * minCompressionRate < static_cast<double>(n * m);
}

}  // namespace tunedist::hooks
