// Tensor helpers of the engine layer (and of the CPU side above it, backend/cpu/checks.h): sizes, overlap, and
// contiguous staging.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>

namespace tunedist::engine {

size_t tensorBytes(const at::Tensor& t);
// True if the storage bytes of `a` and `b` overlap.
bool overlaps(const at::Tensor& a, const at::Tensor& b);

// A contiguous tensor with t's values: t itself when contiguous, else a copy (to copy back with copyBack()).
inline at::Tensor staged(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }
inline void copyBack(const at::Tensor& t, const at::Tensor& s) {
  if (!t.is_same(s)) {
    t.copy_(s);
  }
}

}  // namespace tunedist::engine
