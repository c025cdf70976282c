// Cross-host scatter: gloo over every rank of the group.
#include "backend/engine/hier/algorithms.h"

#include <c10/util/Exception.h>

namespace tunedist::engine::hier {

void scatter(Ctx c, const std::vector<at::Tensor>& blocks, const at::Tensor& out, int root) {
  agreeEverywhere(c, describe(shm::OpCode::kScatter, c.op.seq, bytesOf(out), 0, 0, root));
  if (bytesOf(out) == 0) {
    return;
  }
  std::vector<at::Tensor> outs{glooView(out).view({-1})};
  std::vector<std::vector<at::Tensor>> ins;
  if (c.x.rank() == root) {
    ins.push_back(flatGlooViews(blocks));
  }
  auto opts = withTimeout<c10d::ScatterOptions>(c);
  opts.rootRank = root;
  c.x.countData(size_t(bytesOf(out)));
  c.x.wait(c.x.group(c.x.everyone())->scatter(outs, ins, opts), c.op);
}

}  // namespace tunedist::engine::hier
