// Compression kernels of tunedist's DDP communication hooks, usable on their own from LibTorch (no DDP needed).
//
//   at::Tensor half = at::empty({grad.numel()}, grad.options().dtype(at::kHalf));
//   tunedist::hooks::compressInto(half, grad, worldSize);   // half = half(grad) / worldSize
//   backend->allreduce(...);                                 // sum the compressed gradients
//   tunedist::hooks::decompressInto(grad, half);             // back to fp32
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace tunedist::hooks {

// dst = to(src, dst.dtype) / divisor, rounded exactly as torch's `src.to(dtype).div_(divisor)` (cast first, then
// divide in the low precision; on CUDA torch multiplies by the float reciprocal of the divisor, and so do we).
// dst: fp16 or bf16, contiguous, same numel and device as src; src: fp32 contiguous.
void compressInto(at::Tensor& dst, const at::Tensor& src, int64_t divisor);

// dst.copy_(src) for a low-precision src into a wider dst.
void decompressInto(at::Tensor& dst, const at::Tensor& src);

// In place, no second buffer: writes to(buffer, dtype) / divisor into the first half of `buffer`'s own bytes and
// returns that low-precision view (numel elements). `buffer` must be a contiguous CPU fp32 tensor that owns its
// bytes exclusively until decompressInPlace (its float values are gone). Rounding as compressInto.
at::Tensor compressInPlace(at::Tensor& buffer, at::ScalarType dtype, int64_t divisor);
// Undoes compressInPlace: widens the low-precision view (or `reduced`, a tensor holding the reduced values, when a
// backend returned another tensor) back into `buffer`.
void decompressInPlace(at::Tensor& buffer, const at::Tensor& view, const at::Tensor& reduced);
// Whether compressInPlace can run on `buffer`.
bool canCompressInPlace(const at::Tensor& buffer);

// Whether this build has the hooks' CUDA kernels (CMake option TUNEDIST_CUDA_KERNELS): compressInto on CUDA float32
// tensors, and PowerSGD's error feedback on CUDA, then run one fused pass each instead of two ATen ops. Without
// them those run ATen's ops, with the same results.
bool cudaKernelsBuilt();

// Orthogonalises the columns of every matrix of a batch (B, rows, r), r <= rows, in place, as torch's PowerSGD:
// Gram-Schmidt for r <= 2 or fp16/bf16 (each column divided by its norm, plus `epsilon` when epsilon != 0),
// Householder QR (torch.linalg.qr) otherwise. A column of zeros with epsilon == 0 gives NaNs, as torch's does.
void orthogonalize(at::Tensor& matrices, double epsilon);

// PowerSGD's products on one matrix M (n, m) with P (n, r) and Q (m, r). Contiguous CPU float32
// tensors (lowRankNative) run our kernels, which read M once (BLAS at r = 2..4 is 4-5x slower) and agree with
// ATen's mm to float rounding, not bit for bit; anything else runs mm.
bool lowRankNative(const at::Tensor& matrix, const at::Tensor& p, const at::Tensor& q);
void multiplyMQ(const at::Tensor& matrix, const at::Tensor& q, at::Tensor& p);   // p = M q
void multiplyMtP(const at::Tensor& matrix, const at::Tensor& p, at::Tensor& q);  // q = M^T p
// out = p q^T and, if errorSlice is defined (contiguous CPU float32, out's size), errorSlice = out's old values -
// the new ones, in the same pass (error feedback).
void writePQt(at::Tensor& out, const at::Tensor& p, const at::Tensor& q, const at::Tensor& errorSlice);

// PowerSGD's test: compress an n x m matrix at rank r iff (n + m) * r * minCompressionRate < n * m.
bool shouldCompress(int64_t n, int64_t m, int64_t rank, double minCompressionRate);

}  // namespace tunedist::hooks
