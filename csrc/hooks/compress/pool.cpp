// CompressionPool; see pool.h.
#include "hooks/compress/pool.h"

#include <algorithm>
#include <memory>

#include "tunedist/hooks/hooks.h"

namespace tunedist::hooks {
namespace {

bool sameKind(const at::Tensor& t, const at::TensorOptions& options) {
  return t.scalar_type() == options.dtype().toScalarType() && t.device() == options.device();
}

}  // namespace

at::Tensor CompressionPool::acquire(int64_t numel, const at::TensorOptions& options) {
  if (options.device().type() != at::kCPU) {
    return at::empty({numel}, options);
  }
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
  std::erase_if(free_, [&](const at::Tensor& t) { return sameKind(t, options); });
  return at::empty({numel}, options);
}

void CompressionPool::release(const at::Tensor& tensor) {
  if (!tensor.is_cpu()) {
    return;
  }
  std::lock_guard<std::mutex> guard(mutex_);
  // Back to the whole buffer: a view that starts at the storage's start and spans all of it.
  const int64_t capacity = static_cast<int64_t>(tensor.storage().nbytes()) / static_cast<int64_t>(tensor.itemsize());
  free_.push_back(tensor.storage_offset() == 0 ? tensor.as_strided({capacity}, {1}) : tensor);
}

std::shared_ptr<CompressionPool> makeCompressionPool() { return std::make_shared<CompressionPool>(); }

}  // namespace tunedist::hooks
