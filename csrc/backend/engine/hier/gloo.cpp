// What the cross-host collectives share: the gloo form of tensors and reduce ops, and the metadata agreement that
// every one of them runs first (so gloo only ever sees calls whose sizes match on every rank).
#include "backend/engine/hier/algorithms.h"

#include <c10/util/Exception.h>

namespace tunedist::engine::hier {

at::Tensor glooView(const at::Tensor& t) { return t.scalar_type() == at::kBool ? t.view(at::kByte) : t; }

c10d::ReduceOp glooReduceOp(core::RedOp op, core::DType dtype) {
  if (dtype == core::DType::kBool) {
    switch (op) {
      case core::RedOp::kSum:
      case core::RedOp::kMax:
      case core::RedOp::kBor: return c10d::ReduceOp::MAX;
      case core::RedOp::kProduct:
      case core::RedOp::kMin:
      case core::RedOp::kBand: return c10d::ReduceOp::MIN;
      case core::RedOp::kBxor: return c10d::ReduceOp::BXOR;
      default: break;
    }
  }
  switch (op) {
    case core::RedOp::kSum:
    case core::RedOp::kAvg:
    case core::RedOp::kPremulSum: return c10d::ReduceOp::SUM;
    case core::RedOp::kProduct: return c10d::ReduceOp::PRODUCT;
    case core::RedOp::kMin: return c10d::ReduceOp::MIN;
    case core::RedOp::kMax: return c10d::ReduceOp::MAX;
    case core::RedOp::kBand: return c10d::ReduceOp::BAND;
    case core::RedOp::kBor: return c10d::ReduceOp::BOR;
    case core::RedOp::kBxor: return c10d::ReduceOp::BXOR;
  }
  TORCH_CHECK(false, "tunedist: no gloo form of reduce op ", core::redOpName(op), " on ", core::dtypeName(dtype));
}

std::vector<int64_t> describe(shm::OpCode op, uint64_t seq, int64_t count, int dtype, int redop, int root,
                              int64_t extra) {
  return {int64_t(op), int64_t(seq), count, dtype, redop, root, extra};
}

const std::vector<const char*>& describeFields() {
  static const std::vector<const char*> kFields{"op", "seq", "element count", "dtype", "reduce op", "root", "detail"};
  return kFields;
}

void agreeAmongLeaders(Ctx c, const std::vector<int64_t>& desc, bool holdLocalRanks) {
  if (c.x.localRank() == 0) {
    c.x.agree(c.x.leaders(), c.op, desc, describeFields());
  }
  if (holdLocalRanks && c.x.localSize() > 1) {
    c.comm.barrier(c.op);
  }
}

// The agreement of every op but all_reduce and all_to_all: the leaders first (agreeAmongLeaders), then all ranks.
void agreeEverywhere(Ctx c, const std::vector<int64_t>& desc) {
  agreeAmongLeaders(c, desc);
  c.x.agree(c.x.everyone(), c.op, desc, describeFields());
}

std::vector<at::Tensor> flatGlooViews(const std::vector<at::Tensor>& blocks) {
  std::vector<at::Tensor> views;
  views.reserve(blocks.size());
  for (const auto& b : blocks) {
    views.push_back(glooView(b).view({-1}));
  }
  return views;
}

int64_t bytesOf(const at::Tensor& t) { return t.numel() * int64_t(t.element_size()); }

}  // namespace tunedist::engine::hier
