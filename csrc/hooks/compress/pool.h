// CompressionPool (internal header; pool.cpp): the reused low-precision buffers of the fp16/bf16 hook
// (compress_hook.cpp) and wrappers (low_precision_wrapper.cpp).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace tunedist::hooks {

class CompressionPool {
 public:
  // A contiguous tensor of `numel` elements of `options`, reusing a released buffer when one is large enough.
  at::Tensor acquire(int64_t numel, const at::TensorOptions& options);
  // Gives back a tensor acquire() returned, once nothing reads or writes it any more.
  void release(const at::Tensor& tensor);
  int64_t bytes() const;

 private:
  mutable std::mutex mutex_;
  std::vector<at::Tensor> free_;  // whole buffers
  int64_t bytes_ = 0;             // allocated by the pool: free and in use
};

}  // namespace tunedist::hooks
