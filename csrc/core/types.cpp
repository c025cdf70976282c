// Names and sizes of the engine's element types and reduction operators.
#include "core/types.h"

#include "core/error.h"

namespace tunedist::core {

size_t dtypeSize(DType t) {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kInt8: return 1;
    case DType::kUInt8: return 1;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kBool: return 1;
  }
  TD_CHECK(false, "dtypeSize: unknown dtype code ", static_cast<int>(t));
  return 0;
}

const char* dtypeName(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kBool: return "bool";
  }
  // Error messages print this; a code from a corrupt header must not crash the message itself.
  return "unknown-dtype";
}

const char* redOpName(RedOp op) {
  switch (op) {
    case RedOp::kSum: return "SUM";
    case RedOp::kAvg: return "AVG";
    case RedOp::kProduct: return "PRODUCT";
    case RedOp::kMin: return "MIN";
    case RedOp::kMax: return "MAX";
    case RedOp::kBand: return "BAND";
    case RedOp::kBor: return "BOR";
    case RedOp::kBxor: return "BXOR";
    case RedOp::kPremulSum: return "PREMUL_SUM";
  }
  return "unknown-op";
}

bool isFloating(DType t) {
  switch (t) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kFloat16:
    case DType::kBFloat16: return true;
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kInt32:
    case DType::kInt64:
    case DType::kBool: return false;
  }
  TD_CHECK(false, "isFloating: unknown dtype code ", static_cast<int>(t));
  return false;
}

}  // namespace tunedist::core
