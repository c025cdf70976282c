// Cross-host all_gather: gloo over every rank of the group.
#include "backend/engine/hier/algorithms.h"

#include <c10/util/Exception.h>

namespace tunedist::engine::hier {

void allgather(Ctx c, const at::Tensor& in, const std::vector<at::Tensor>& blocks) {
  agreeEverywhere(c, describe(shm::OpCode::kAllgather, c.op.seq, bytesOf(in)));
  if (bytesOf(in) == 0) {
    return;
  }
  std::vector<at::Tensor> ins{glooView(in).view({-1})};
  std::vector<std::vector<at::Tensor>> outs{flatGlooViews(blocks)};
  c.x.countData(size_t(bytesOf(in)) * blocks.size());
  c.x.wait(c.x.group(c.x.everyone())->allgather(outs, ins, withTimeout<c10d::AllgatherOptions>(c)), c.op);
}

}  // namespace tunedist::engine::hier
