// Element types and reduction operators the engine understands, independent of torch.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tunedist::core {

enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kBool = 8,
};
constexpr int kNumDTypes = 9;

enum class RedOp : uint8_t {
  kSum = 0,
  kAvg = 1,
  kProduct = 2,
  kMin = 3,
  kMax = 4,
  kBand = 5,
  kBor = 6,
  kBxor = 7,
  kPremulSum = 8,
};

size_t dtypeSize(DType t);
const char* dtypeName(DType t);
const char* redOpName(RedOp op);
bool isFloating(DType t);

}  // namespace tunedist::core
