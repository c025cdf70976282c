// Hierarchical all-reduce across hosts.
//
// Host h has L_h ranks (positions 0..L_h-1). HostSlicing cuts the buffer the same way on every rank of a host:
// position j owns block j = [j*b, (j+1)*b), b = count / L_h, and position 0 also owns the tail [L_h*b, count).
//   1. The host leaders (position 0 of every host) agree on the metadata over gloo, so gloo never sees
//      disagreeing sizes. The other ranks of a host agree with their leader through the shared-memory
//      descriptor of step 2, which they cannot leave before the leader has joined it.
//   2. Inside each host: shared-memory reduce-scatter of the blocks (position j gets the host's partial result of
//      block j) and a shared-memory all-reduce of the tail (fewer than L_h elements; every position gets it).
//   3. Across hosts: crossHostSpans() refines every host's slicing into spans; in each span every host has exactly
//      one owner holding that host's partial result, and the owners all-reduce the span through gloo. Each rank
//      thus sends about count/L_h elements, not count, and all of a host's ranks use the network at once.
//      Why this slicing is right for uneven hosts (2+1, 3+2, ...): it never requires two hosts to cut the buffer
//      alike; the common refinement only pairs, element by element, the one rank of each host that holds the
//      element's partial sum. Spans are visited in ascending order by every rank, so the gloo groups (one per
//      distinct owner tuple, created at first use) can neither deadlock nor mismatch: the lowest pending span's
//      owners all reach it. A host with fewer ranks simply carries more spans per rank.
//   4. Inside each host: shared-memory all-gather of the blocks and broadcast of the tail from position 0.
// AVG is reduced as SUM and divided by the group size after step 3; PREMUL_SUM applies its factor in step 2.
// Float results are not bit-identical to the one-host path (host partials are rounded once per host).
#include <algorithm>
#include <cstring>

#include "backend/hier/hier_ops.h"
#include "shm/host_topology.h"

namespace tunedist::hier {
namespace {

int64_t factorBits(double factor) {
  int64_t bits = 0;
  std::memcpy(&bits, &factor, sizeof(bits));
  return bits;
}

void reduceInsideHost(Ctx c, char* base, size_t count, size_t es, const shm::HostSlicing& s,
                      const shm::ReduceArgs& hostArgs) {
  const int lsize = c.x.localSize();
  if (s.block > 0) {
    std::vector<const void*> blocks;
    for (int p = 0; p < lsize; ++p) {
      blocks.push_back(base + size_t(p) * s.block * es);
    }
    c.comm.reduceScatter(c.op, blocks.data(), base + size_t(c.x.localRank()) * s.block * es, s.block, hostArgs);
  }
  if (s.tailBegin < count) {
    char* tail = base + s.tailBegin * es;
    c.comm.allreduce(c.op, tail, tail, count - s.tailBegin, hostArgs);
  }
}

void shareInsideHost(Ctx c, char* base, size_t count, size_t es, const shm::HostSlicing& s) {
  const int lsize = c.x.localSize();
  if (s.block > 0) {
    std::vector<void*> blocks;
    for (int p = 0; p < lsize; ++p) {
      blocks.push_back(base + size_t(p) * s.block * es);
    }
    c.comm.allgather(c.op, blocks[size_t(c.x.localRank())], s.block * es, blocks.data());
  }
  if (s.tailBegin < count) {
    c.comm.broadcast(c.op, base + s.tailBegin * es, (count - s.tailBegin) * es, 0);
  }
}

}  // namespace

void allreduce(Ctx c, const at::Tensor& t, const shm::ReduceArgs& args) {
  const auto& layout = c.x.layout();
  const at::Tensor flat = t.view({-1});
  const size_t count = size_t(flat.numel());
  const size_t es = size_t(flat.element_size());
  char* base = static_cast<char*>(flat.data_ptr());
  // Step 1/4: the leaders agree on what is being reduced.
  if (c.x.localRank() == 0) {
    c.x.agree(c.x.leaders(), c.op,
              describe(shm::OpCode::kAllreduce, c.op.seq, int64_t(count), int(args.dtype), int(args.op), -1,
                       factorBits(args.factor)),
              describeFields());
  }
  shm::ReduceArgs hostArgs = args;
  if (args.op == shm::RedOp::kAvg) {
    hostArgs.op = shm::RedOp::kSum;
  }
  const auto slicing = shm::HostSlicing::of(count, c.x.localSize());
  // Step 2/4: host partial results, block j on position j.
  if (c.x.localSize() > 1) {
    reduceInsideHost(c, base, count, es, slicing, hostArgs);
  } else if (args.op == shm::RedOp::kPremulSum) {
    flat.mul_(args.factor);  // a host of one rank: its term still gets the factor
  }
  // Step 3/4: each span's owners all-reduce it across hosts.
  const auto glooOp = glooReduceOp(args.op, args.dtype);
  std::vector<at::Tensor> owned;
  for (const auto& span : shm::crossHostSpans(count, layout.hostSizes())) {
    if (span.owners[size_t(c.x.host())] != c.x.localRank()) {
      continue;
    }
    std::vector<int> members;
    for (int h = 0; h < layout.numHosts(); ++h) {
      members.push_back(layout.rankAt(h, span.owners[size_t(h)]));
    }
    std::sort(members.begin(), members.end());
    at::Tensor piece = flat.narrow(0, int64_t(span.begin), int64_t(span.end - span.begin));
    std::vector<at::Tensor> tensors{glooView(piece)};
    c10d::AllreduceOptions opts;
    opts.reduceOp = glooOp;
    opts.timeout = c.x.remaining(c.op);
    c.x.countData(size_t(piece.numel()) * es);
    c.x.wait(c.x.group(members)->allreduce(tensors, opts), c.op);
    owned.push_back(piece);
  }
  if (args.op == shm::RedOp::kAvg) {
    for (auto& piece : owned) {
      if (shm::isFloating(args.dtype)) {
        piece.div_(double(c.x.size()));
      } else {
        piece.copy_(piece.div(c.x.size(), "trunc"));  // integers truncate toward zero, as on one host
      }
    }
  }
  // Step 4/4: every rank of the host gets every block.
  if (c.x.localSize() > 1) {
    shareInsideHost(c, base, count, es, slicing);
  }
}

}  // namespace tunedist::hier
