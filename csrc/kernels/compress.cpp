// Entry points of the compression kernels: argument checks, then the active SIMD level's table.
#include "kernels/compress.h"

#include <cstdint>

#include "core/error.h"
#include "kernels/kernel_table_impl.h"

namespace tunedist::kernels {
namespace {

int precisionIndex(LowPrecision precision, const char* op) {
  const int index = static_cast<int>(precision);
  TD_CHECK(index == 0 || index == 1, op, ": unknown low precision code ", index);
  return index;
}

// The two buffers must be the same address or disjoint: a partial overlap would read overwritten input.
void checkAliasing(const void* out, size_t outBytes, const void* in, size_t inBytes, const char* op) {
  const auto o = reinterpret_cast<uintptr_t>(out);
  const auto i = reinterpret_cast<uintptr_t>(in);
  TD_CHECK(o == i || o + outBytes <= i || i + inBytes <= o, op,
           ": output and input overlap partially (they must be the same buffer or disjoint)");
}

}  // namespace

void compressToLowPrecision(LowPrecision precision, void* out, const void* in, size_t count, int divisor) {
  const int index = precisionIndex(precision, "compressToLowPrecision");
  TD_CHECK(divisor >= 1, "compressToLowPrecision: divisor must be >= 1, got ", divisor);
  if (count == 0) return;
  TD_CHECK(out != nullptr && in != nullptr, "compressToLowPrecision: null buffer");
  checkAliasing(out, count * 2, in, count * 4, "compressToLowPrecision");
  kernels::activeKernelTable().compress[index](out, in, count, static_cast<float>(divisor));
}

void widenFromLowPrecision(LowPrecision precision, void* out, const void* in, size_t count) {
  const int index = precisionIndex(precision, "widenFromLowPrecision");
  if (count == 0) return;
  TD_CHECK(out != nullptr && in != nullptr, "widenFromLowPrecision: null buffer");
  checkAliasing(out, count * 4, in, count * 2, "widenFromLowPrecision");
  kernels::activeKernelTable().decompress[index](out, in, count);
}

}  // namespace tunedist::kernels
