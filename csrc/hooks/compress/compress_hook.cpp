// fp16_compress_hook / bf16_compress_hook: one hook, parametrised by the low-precision dtype. Steps:
// 1. compress: half(bucket) / size (compression.cpp). CPU float32 buckets are compressed in place, into the first
//    half of the bucket's own bytes (no extra memory); others go to a pooled buffer (pool.cpp);
// 2. allreduce (sum) the half-size tensor;
// 3. decompress into the bucket; a pooled buffer goes back to the pool.
#include <ATen/core/jit_type.h>

#include "hooks/common.h"
#include "hooks/compress/pool.h"

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

}  // namespace

FuturePtr runCompressHook(const GroupPtr& group, c10d::GradBucket& bucket, at::ScalarType dtype,
                          const std::shared_ptr<CompressionPool>& pool) {
  TORCH_CHECK(group, "tunedist.hooks.", dtype == at::kHalf ? "fp16" : "bf16", "_compress_hook: no process group");
  at::Tensor buffer = bucket.getBufferRef();
  if (canCompressInPlace(buffer)) {
    at::Tensor view = compressInPlace(buffer, dtype, group->getSize());
    return allreduceSum(group, view)
        ->then(
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
