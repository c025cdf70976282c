#include "shm/descriptor.h"

#include <cstring>
#include <sstream>

namespace tunedist::shm {

const char* opCodeName(OpCode op) {
  switch (op) {
    case OpCode::kAllreduce: return "all_reduce";
    case OpCode::kBroadcast: return "broadcast";
    case OpCode::kReduce: return "reduce";
    case OpCode::kAllgather: return "all_gather";
    case OpCode::kGather: return "gather";
    case OpCode::kScatter: return "scatter";
    case OpCode::kReduceScatter: return "reduce_scatter";
    case OpCode::kAlltoall: return "all_to_all";
    case OpCode::kBarrier: return "barrier";
    case OpCode::kSymmetricExchange: return "symmetric_rendezvous";
  }
  return "unknown-op";
}

OpDesc makeDesc(OpCode op, uint64_t seq, uint64_t count, int root, core::DType dtype, core::RedOp redop,
                double factor) {
  OpDesc d{};
  d.opcode = uint32_t(op);
  d.seq = seq;
  d.count = count;
  d.root = root;
  d.dtype = uint8_t(dtype);
  d.redop = uint8_t(redop);
  std::memcpy(&d.factorBits, &factor, sizeof(factor));
  return d;
}

std::string describeDesc(const OpDesc& d) {
  std::ostringstream os;
  if (!d.valid) {
    return "(no operation)";
  }
  os << opCodeName(OpCode(d.opcode)) << " seq " << d.seq;
  if (d.count != 0 || OpCode(d.opcode) != OpCode::kAlltoall) {
    os << ", count " << d.count;
  }
  switch (OpCode(d.opcode)) {
    case OpCode::kAllreduce:
    case OpCode::kReduce:
    case OpCode::kReduceScatter: {
      double f = 0;
      std::memcpy(&f, &d.factorBits, sizeof(f));
      os << ", " << core::dtypeName(core::DType(d.dtype)) << ", " << core::redOpName(core::RedOp(d.redop));
      if (core::RedOp(d.redop) == core::RedOp::kPremulSum) {
        os << "(" << f << ")";
      }
      break;
    }
    default: break;
  }
  if (d.root >= 0) {
    os << ", root " << d.root;
  }
  return os.str();
}

bool sameDesc(const OpDesc& a, const OpDesc& b) {
  return a.valid == b.valid && a.opcode == b.opcode && a.seq == b.seq && a.count == b.count && a.dtype == b.dtype &&
         a.redop == b.redop && a.root == b.root && a.factorBits == b.factorBits;
}

}  // namespace tunedist::shm
