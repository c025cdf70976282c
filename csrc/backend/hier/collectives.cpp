// The cross-host forms of the collectives other than all_reduce: simple schemes off the training hot path.
// Each one first has its participants agree on the metadata (CrossHost::agree), so gloo only ever sees calls
// whose sizes match on every rank, and skips gloo when there is nothing to move.
//   broadcast  shared-memory broadcast on the root's host, gloo broadcast among the host leaders, shared-memory
//              broadcast on the other hosts.
//   all_gather, gather, scatter, all_to_all, barrier: gloo over every rank of the group (all_to_all as bytes).
#include "backend/hier/hier_ops.h"

#include <c10/util/Exception.h>

namespace tunedist::hier {

at::Tensor glooView(const at::Tensor& t) { return t.scalar_type() == at::kBool ? t.view(at::kByte) : t; }

c10d::ReduceOp glooReduceOp(shm::RedOp op, shm::DType dtype) {
  if (dtype == shm::DType::kBool) {
    switch (op) {
      case shm::RedOp::kSum:
      case shm::RedOp::kMax:
      case shm::RedOp::kBor: return c10d::ReduceOp::MAX;
      case shm::RedOp::kProduct:
      case shm::RedOp::kMin:
      case shm::RedOp::kBand: return c10d::ReduceOp::MIN;
      case shm::RedOp::kBxor: return c10d::ReduceOp::BXOR;
      default: break;
    }
  }
  switch (op) {
    case shm::RedOp::kSum:
    case shm::RedOp::kAvg:
    case shm::RedOp::kPremulSum: return c10d::ReduceOp::SUM;
    case shm::RedOp::kProduct: return c10d::ReduceOp::PRODUCT;
    case shm::RedOp::kMin: return c10d::ReduceOp::MIN;
    case shm::RedOp::kMax: return c10d::ReduceOp::MAX;
    case shm::RedOp::kBand: return c10d::ReduceOp::BAND;
    case shm::RedOp::kBor: return c10d::ReduceOp::BOR;
    case shm::RedOp::kBxor: return c10d::ReduceOp::BXOR;
  }
  TORCH_CHECK(false, "tunedist: no gloo form of reduce op ", shm::redOpName(op), " on ", shm::dtypeName(dtype));
}

std::vector<int64_t> describe(shm::OpCode op, uint64_t seq, int64_t count, int dtype, int redop, int root,
                              int64_t extra) {
  return {int64_t(op), int64_t(seq), count, dtype, redop, root, extra};
}

const std::vector<const char*>& describeFields() {
  static const std::vector<const char*> kFields{"op", "seq", "element count", "dtype", "reduce op", "root",
                                                "detail"};
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

namespace {

// Flat gloo views of one block per rank: an all_gather's outputs, a gather or scatter root's blocks.
std::vector<at::Tensor> flatGlooViews(const std::vector<at::Tensor>& blocks) {
  std::vector<at::Tensor> views;
  views.reserve(blocks.size());
  for (const auto& b : blocks) {
    views.push_back(glooView(b).view({-1}));
  }
  return views;
}

template <typename Opts>
Opts withTimeout(Ctx c) {
  Opts o;
  o.timeout = c.x.remaining(c.op);
  return o;
}

int64_t bytesOf(const at::Tensor& t) { return t.numel() * int64_t(t.element_size()); }

// The agreement of every op but all_reduce and all_to_all: the leaders first (agreeAmongLeaders), then all ranks.
void agreeEverywhere(Ctx c, const std::vector<int64_t>& desc) {
  agreeAmongLeaders(c, desc);
  c.x.agree(c.x.everyone(), c.op, desc, describeFields());
}

}  // namespace

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

void alltoallv(Ctx c, const at::Tensor& src, const std::vector<int64_t>& sendBytes, const at::Tensor& dst,
               const std::vector<int64_t>& recvBytes) {
  // Every rank publishes what it sends to and expects from each peer; each pair must agree.
  const int size = c.x.size();
  std::vector<int64_t> desc = describe(shm::OpCode::kAlltoall, c.op.seq, 0, 0);
  agreeAmongLeaders(c, desc);
  desc.insert(desc.end(), sendBytes.begin(), sendBytes.end());
  desc.insert(desc.end(), recvBytes.begin(), recvBytes.end());
  auto all = c.x.gatherDescs(c.x.everyone(), c.op, desc);
  const size_t head = describeFields().size();
  int64_t total = 0;
  for (int p = 0; p < size; ++p) {
    TORCH_CHECK(all[size_t(p)][0] == desc[0] && all[size_t(p)][1] == desc[1], "ranks disagree on the operation: rank ",
                p, " runs op ", all[size_t(p)][0], " seq ", all[size_t(p)][1], " but rank ", c.x.rank(), " runs op ",
                desc[0], " seq ", desc[1]);
    for (int q = 0; q < size; ++q) {
      const int64_t sent = all[size_t(p)][head + size_t(q)];
      const int64_t expected = all[size_t(q)][head + size_t(size) + size_t(p)];
      TORCH_CHECK(sent == expected, "all_to_all sizes disagree: rank ", p, " sends ", sent, " bytes to rank ", q,
                  ", which expects ", expected, " bytes from it");
      total += sent;
    }
  }
  if (total == 0) {
    return;
  }
  std::vector<int64_t> outSplits = recvBytes;
  std::vector<int64_t> inSplits = sendBytes;
  at::Tensor in = src;
  at::Tensor out = dst;
  c.x.countData(size_t(src.numel()));
  c.x.wait(c.x.group(c.x.everyone())->alltoall_base(out, in, outSplits, inSplits,
                                                   withTimeout<c10d::AllToAllOptions>(c)),
           c.op);
}

void barrier(Ctx c) {
  agreeEverywhere(c, describe(shm::OpCode::kBarrier, c.op.seq, 0, 0));
}

}  // namespace tunedist::hier
