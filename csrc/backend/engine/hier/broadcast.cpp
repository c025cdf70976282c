// Cross-host broadcast: shared-memory broadcast on the root's host, gloo broadcast among the host leaders, then
// shared-memory broadcast on the other hosts.
#include "backend/engine/hier/algorithms.h"

#include <c10/util/Exception.h>

namespace tunedist::engine::hier {

void broadcast(Ctx c, const at::Tensor& t, int root) {
  const auto& layout = c.x.layout();
  const int rootHost = layout.hostOf[size_t(root)];
  agreeEverywhere(c, describe(shm::OpCode::kBroadcast, c.op.seq, bytesOf(t), 0, 0, root));
  const size_t bytes = size_t(bytesOf(t));
  if (c.x.host() == rootHost && c.x.localSize() > 1) {
    c.comm.broadcast(c.op, t.data_ptr(), bytes, layout.localRankOf[size_t(root)]);
  }
  if (c.x.localRank() == 0 && bytes > 0) {
    std::vector<at::Tensor> tensors{glooView(t)};
    auto opts = withTimeout<c10d::BroadcastOptions>(c);
    opts.rootRank = rootHost;  // the leaders' group lists hosts in order
    c.x.countData(bytes);
    c.x.wait(c.x.group(c.x.leaders())->broadcast(tensors, opts), c.op);
  }
  if (c.x.host() != rootHost && c.x.localSize() > 1) {
    c.comm.broadcast(c.op, t.data_ptr(), bytes, 0);
  }
}

}  // namespace tunedist::engine::hier
