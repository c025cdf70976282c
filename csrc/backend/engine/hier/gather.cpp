// Cross-host gather: gloo over every rank of the group.
#include "backend/engine/hier/algorithms.h"

#include <c10/util/Exception.h>

namespace tunedist::engine::hier {

void gather(Ctx c, const at::Tensor& in, const std::vector<at::Tensor>& blocks, int root) {
  agreeEverywhere(c, describe(shm::OpCode::kGather, c.op.seq, bytesOf(in), 0, 0, root));
  if (bytesOf(in) == 0) {
    return;
  }
  std::vector<at::Tensor> ins{glooView(in).view({-1})};
  std::vector<std::vector<at::Tensor>> outs;
  if (c.x.rank() == root) {
    outs.push_back(flatGlooViews(blocks));
  }
  auto opts = withTimeout<c10d::GatherOptions>(c);
  opts.rootRank = root;
  c.x.countData(size_t(bytesOf(in)));
  c.x.wait(c.x.group(c.x.everyone())->gather(outs, ins, opts), c.op);
}

}  // namespace tunedist::engine::hier
