// Cross-host reduce: the hierarchical all-reduce (allreduce.cpp), into a copy on every rank but the root.
#include "backend/engine/hier/algorithms.h"

#include <c10/util/Exception.h>

namespace tunedist::engine::hier {

void reduce(Ctx c, const at::Tensor& t, const kernels::ReduceArgs& args, int root) {
  allreduce(c, c.x.rank() == root ? t : t.clone(), args);
}

}  // namespace tunedist::engine::hier
