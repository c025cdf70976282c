// fp16_compress_hook / bf16_compress_hook: one hook, parametrised by the low-precision dtype. Steps:
// 1. compress: half(bucket) / size. CPU float32 buckets are compressed in place, into the first
//    half of the bucket's own bytes (no extra memory); others go to a pooled buffer;
// 2. allreduce (sum) the half-size tensor;
// 3. decompress into the bucket; a pooled buffer goes back to the pool.
#include <ATen/core/jit_type.h>

#include <algorithm>

#include "hooks/hook_common.h"

namespace tunedist::hooks {
namespace {

class CompressCommHook : public TensorResultHook {
 public:
  CompressCommHook(GroupPtr group, at::ScalarType dtype)
      : group_(std::move(group)), dtype_(dtype), pool_(makeCompressionPool()) {}
  FuturePtr runHook(c10d::GradBucket& bucket) override { return runCompressHook(group_, bucket, dtype_, pool_); }

 private:
  GroupPtr group_;
  at::ScalarType dtype_;
  std::shared_ptr<CompressionPool> pool_;
};

bool sameKind(const at::Tensor& t, const at::TensorOptions& options) {
  return t.scalar_type() == options.dtype().toScalarType() && t.device() == options.device();
}

}  // namespace

at::Tensor CompressionPool::acquire(int64_t numel, const at::TensorOptions& options) {
  std::lock_guard<std::mutex> guard(mutex_);
  // Smallest free buffer that fits; free buffers of this kind that are too small are dropped (buckets keep
  // their sizes from step to step, so they would not fit later either).
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (sameKind(*it, options) && it->numel() >= numel && (best == free_.end() || it->numel() < best->numel())) {
      best = it;
    }
  }
  if (best != free_.end()) {
    at::Tensor buffer = *best;
    free_.erase(best);
    return buffer.narrow(0, 0, numel);
  }
  std::erase_if(free_, [&](const at::Tensor& t) {
    if (!sameKind(t, options)) return false;
    bytes_ -= static_cast<int64_t>(t.nbytes());
    return true;
  });
  at::Tensor buffer = at::empty({numel}, options);
  bytes_ += static_cast<int64_t>(buffer.nbytes());
  return buffer;
}

void CompressionPool::release(const at::Tensor& tensor) {
  std::lock_guard<std::mutex> guard(mutex_);
  // Back to the whole buffer: a view that starts at the storage's start and spans all of it.
  const int64_t capacity = static_cast<int64_t>(tensor.storage().nbytes()) / static_cast<int64_t>(tensor.itemsize());
  free_.push_back(tensor.storage_offset() == 0 ? tensor.as_strided({capacity}, {1}) : tensor);
}

int64_t CompressionPool::bytes() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return bytes_;
}

std::shared_ptr<CompressionPool> makeCompressionPool() { return std::make_shared<CompressionPool>(); }
int64_t compressionPoolBytes(const CompressionPool& pool) { return pool.bytes(); }

FuturePtr runCompressHook(const GroupPtr& group, c10d::GradBucket& bucket, at::ScalarType dtype,
                          const std::shared_ptr<CompressionPool>& pool) {
  TORCH_CHECK(group, "tunedist.hooks.", dtype == at::kHalf ? "fp16" : "bf16", "_compress_hook: no process group");
  at::Tensor buffer = bucket.getBufferRef();
  if (canCompressInPlace(buffer)) {
    at::Tensor view = compressInPlace(buffer, dtype, group->getSize());
    return allreduceSum(group, view)->then(
        [buffer, view](c10::ivalue::Future& fut) {
          at::Tensor bucketBuffer = buffer;
          decompressInPlace(bucketBuffer, view, hookResultTensor(fut.value()));
          return c10::IValue(bucketBuffer);
        },
        c10::TensorType::get());
  }
  const auto options = buffer.options().dtype(dtype);
  at::Tensor compressed = pool ? pool->acquire(buffer.numel(), options) : at::empty({buffer.numel()}, options);
  compressInto(compressed, buffer, group->getSize());
  return allreduceSum(group, compressed)
      ->then(
          [buffer, compressed, pool](c10::ivalue::Future& fut) {
            at::Tensor bucketBuffer = buffer;
            decompressInto(bucketBuffer, hookResultTensor(fut.value()));
            if (pool) pool->release(compressed);
            return c10::IValue(bucketBuffer);
          },
          c10::TensorType::get());
}

std::unique_ptr<c10d::CommHookInterface> makeCompressHook(GroupPtr group, at::ScalarType dtype) {
  TORCH_CHECK(group, "tunedist.hooks.register: compression hooks need a process group");
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16,
              "tunedist.hooks.register: compression to float16 or bfloat16 only, got ", dtype);
  return std::make_unique<CompressCommHook>(std::move(group), dtype);
}

}  // namespace tunedist::hooks
