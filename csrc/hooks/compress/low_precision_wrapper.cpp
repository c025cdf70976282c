// fp16_compress_wrapper / bf16_compress_wrapper around another C++ hook: the inner hook sees the bucket cast to
// the low precision (no division: the inner hook divides), its result is cast back into the original bucket.
// Casts: compression.cpp; buffers: pool.cpp.
#include <ATen/core/jit_type.h>

#include "hooks/common.h"
#include "hooks/compress/pool.h"

namespace tunedist::hooks {
namespace {

class LowPrecisionWrapper : public TensorResultHook {
 public:
  LowPrecisionWrapper(std::unique_ptr<c10d::CommHookInterface> inner, at::ScalarType dtype)
      : inner_(std::move(inner)), dtype_(dtype), pool_(makeCompressionPool()) {}

  FuturePtr runHook(c10d::GradBucket& bucket) override {
    at::Tensor original = bucket.getBufferRef();
    at::Tensor lowp = pool_->acquire(original.numel(), original.options().dtype(dtype_));
    compressInto(lowp, original, 1);  // a plain cast: x / 1 is exact
    bucket.setBuffer(lowp);
    FuturePtr fut = inner_->runHook(bucket);
    c10d::CommHookInterface* inner = inner_.get();
    return fut->then(
        [original, lowp, inner, pool = pool_](c10::ivalue::Future& f) {
          at::Tensor result = inner->parseHookResult(f.value());
          at::Tensor out = original;
          if (result.scalar_type() == out.scalar_type()) {
            out.copy_(result);
          } else {
            decompressInto(out, result);
          }
          pool->release(lowp);
          return c10::IValue(out);
        },
        c10::TensorType::get());
  }

 private:
  std::unique_ptr<c10d::CommHookInterface> inner_;
  at::ScalarType dtype_;
  std::shared_ptr<CompressionPool> pool_;
};

}  // namespace

std::unique_ptr<c10d::CommHookInterface> makeLowPrecisionWrapper(std::unique_ptr<c10d::CommHookInterface> inner,
                                                                 at::ScalarType dtype) {
  TORCH_CHECK(inner, "tunedist.hooks.register: the wrapper needs a hook to wrap");
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16,
              "tunedist.hooks.register: wrappers cast to float16 or bfloat16 only, got ", dtype);
  return std::make_unique<LowPrecisionWrapper>(std::move(inner), dtype);
}

}  // namespace tunedist::hooks
