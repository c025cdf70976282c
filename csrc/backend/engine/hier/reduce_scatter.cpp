// Cross-host reduce_scatter: the hierarchical all-reduce (allreduce.cpp) of every block at once, then our own
// block out of it.
#include "backend/engine/hier/algorithms.h"

#include <c10/util/Exception.h>

namespace tunedist::engine::hier {

void reduceScatter(Ctx c, const std::vector<at::Tensor>& blocks, const at::Tensor& out,
                   const kernels::ReduceArgs& args) {
  std::vector<at::Tensor> flat;
  flat.reserve(blocks.size());
  for (const auto& b : blocks) {
    flat.push_back(b.reshape({-1}));
  }
  at::Tensor all = at::cat(flat);
  allreduce(c, all, args);
  out.copy_(all.narrow(0, int64_t(c.x.rank()) * out.numel(), out.numel()).view(out.sizes()));
}

}  // namespace tunedist::engine::hier
