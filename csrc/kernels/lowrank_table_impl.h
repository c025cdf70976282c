// The function table each SIMD level of the low-rank kernels exports (lowrank_{scalar,avx2}.cpp, built from
// lowrank_impl.h); lowrank.cpp picks one by the active SIMD level. Arguments are validated there.
#pragma once

#include <cstdint>

namespace tunedist::kernels {

struct LowRankTable {
  // m is written only when err is not null (m += err).
  void (*project)(float* m, const float* err, int64_t cols, const float* qT, int64_t r, float* p, int64_t rowBegin,
                  int64_t rowEnd);
  void (*projectT)(const float* m, int64_t rows, int64_t cols, const float* p, int64_t r, float* qT, int64_t colBegin,
                   int64_t colEnd);
  void (*expand)(float* out, float* err, int64_t cols, const float* p, const float* qT, int64_t r, int64_t rowBegin,
                 int64_t rowEnd);
};

namespace scalar {
extern const LowRankTable kLowRankTable;
}
namespace avx2 {
extern const LowRankTable kLowRankTable;  // built with FMA
}

}  // namespace tunedist::kernels
