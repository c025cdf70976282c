// The operation descriptor every rank writes in its first round (layout.h OpDesc): what each op is called, how a
// descriptor is made, and how two are compared and described in the error of ranks that disagree.
#pragma once

#include <cstdint>
#include <string>

#include "core/types.h"
#include "shm/layout.h"

namespace tunedist::shm {

enum class OpCode : uint32_t {
  kAllreduce = 1,
  kBroadcast,
  kReduce,
  kAllgather,
  kGather,
  kScatter,
  kReduceScatter,
  kAlltoall,
  kBarrier,
  // torch's symm_mem.rendezvous and c10d windows: every rank's buffer of one symmetric allocation (count: its bytes).
  kSymmetricExchange,
};
const char* opCodeName(OpCode op);

OpDesc makeDesc(OpCode op, uint64_t seq, uint64_t count, int root, core::DType dtype = core::DType::kUInt8,
                core::RedOp redop = core::RedOp::kSum, double factor = 0.0);

// Whether two ranks called the same operation (everything but the zero-copy marks and the probe request).
bool sameDesc(const OpDesc& a, const OpDesc& b);
// "all_reduce seq 4, count 10, float32, sum", for the error of ranks that disagree.
std::string describeDesc(const OpDesc& d);

}  // namespace tunedist::shm
