#include "backend/engine/tensors.h"

#include <utility>

namespace tunedist::engine {

size_t tensorBytes(const at::Tensor& t) { return size_t(t.numel()) * t.element_size(); }

bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0 || !a.has_storage() || !b.has_storage()) {
    return false;
  }
  if (a.storage().data() != b.storage().data()) {
    return false;
  }
  // Conservative: the byte span from the first to the last element, whatever the strides.
  auto span = [](const at::Tensor& t) {
    auto begin = static_cast<const char*>(t.data_ptr());
    int64_t last = 0;
    for (int64_t d = 0; d < t.dim(); ++d) {
      last += (t.size(d) - 1) * t.stride(d);
    }
    return std::make_pair(begin, begin + (last + 1) * t.element_size());
  };
  auto [a0, a1] = span(a);
  auto [b0, b1] = span(b);
  return a0 < b1 && b0 < a1;
}

}  // namespace tunedist::engine
