// CompressionPool (internal header; pool.cpp): the reused low-precision buffers of the fp16/bf16 hook
// (compress_hook.cpp) and wrappers (low_precision_wrapper.cpp).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace tunedist::hooks {

// Pools CPU buffers only. A CUDA hook's future completes once NCCL's work is queued, so a CUDA buffer released from
// its callback could be handed to the next bucket's compression (on the caller's stream) while NCCL still reads it;
// CUDA tensors come from the caching allocator instead, which ProcessGroupNCCL's recordStream keeps stream-safe.
class CompressionPool {
 public:
  // A contiguous tensor of `numel` elements of `options`, reusing a released buffer when one is large enough (on the
  // CPU; elsewhere a fresh one).
  at::Tensor acquire(int64_t numel, const at::TensorOptions& options);
  // Gives back a tensor acquire() returned, once nothing reads or writes it any more (a non-CPU one is dropped).
  void release(const at::Tensor& tensor);

 private:
  std::mutex mutex_;
  std::vector<at::Tensor> free_;  // whole buffers
};

}  // namespace tunedist::hooks
