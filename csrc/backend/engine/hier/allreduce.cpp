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
// Steps 2-4 are pipelined: the buffer is cut into chunks (pipelineChunks) that each run steps 2-4 on their own,
// and gloo carries chunk k between hosts while shared memory reduces chunk k+1 and shares chunk k-1:
//   RS(0), launch(0), RS(1), launch(1), finish(0), RS(2), launch(2), finish(1), ..., finish(last)
// where launch(k) starts chunk k's gloo all-reduces without waiting and finish(k) waits for them and runs step 4.
// Every rank of a host runs the same sequence of shared-memory operations, and every member of a gloo group
// launches its operations in the same (chunk, span) order, so the chunking changes neither the agreement above
// nor the deadlock argument of step 3 (creation in ascending (chunk, span) order). Chunk size:
// CrossHostOptions::chunkBytesFor (a quarter of the call within 1-8 MiB, or TUNEDIST_CROSS_HOST_CHUNK_BYTES); full
// chunks hold a multiple of every host's size, so only the last chunk can have a tail.
// AVG is reduced as SUM and divided by the group size after step 3; PREMUL_SUM applies its factor in step 2.
// Float results are not bit-identical to the one-host path (host partials are rounded once per host).
#include <algorithm>
#include <cstring>
#include <numeric>

#include "backend/engine/hier/algorithms.h"
#include "topology/host_topology.h"

namespace tunedist::engine::hier {
namespace {

// One chunk [begin, end) of the flat buffer in flight between hosts: its slicing, the gloo operations launched
// on its owned spans, and those spans.
struct Chunk {
  size_t begin = 0;
  size_t end = 0;
  topology::HostSlicing slicing;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<at::Tensor> owned;
};

// Cuts `count` elements into chunks of about `chunkElems`; all but the last hold a multiple of every host's size
// (and of 64 elements), so no host slicing of a full chunk has a tail. At least one chunk, even for count 0.
std::vector<Chunk> pipelineChunks(size_t count, const std::vector<int>& hostSizes, size_t chunkElems) {
  size_t unit = 64;
  for (int localSize : hostSizes) {
    unit = std::lcm(unit, size_t(localSize));
  }
  const size_t step = std::max(unit, chunkElems / unit * unit);
  std::vector<Chunk> chunks;
  size_t begin = 0;
  do {
    Chunk k;
    k.begin = begin;
    k.end = count - begin > step ? begin + step : count;
    chunks.push_back(std::move(k));
    begin = chunks.back().end;
  } while (begin < count);
  return chunks;
}

int64_t factorBits(double factor) {
  int64_t bits = 0;
  std::memcpy(&bits, &factor, sizeof(bits));
  return bits;
}

void reduceInsideHost(Ctx c, char* base, size_t count, size_t es, const topology::HostSlicing& s,
                      const kernels::ReduceArgs& hostArgs) {
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

void shareInsideHost(Ctx c, char* base, size_t count, size_t es, const topology::HostSlicing& s) {
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

// Step 3 of chunk k: starts the gloo all-reduce of every span of the chunk that this rank owns, without waiting.
void launchAcrossHosts(Ctx c, const at::Tensor& flat, size_t es, const kernels::ReduceArgs& args, Chunk& k) {
  const auto& layout = c.x.layout();
  const auto glooOp = glooReduceOp(args.op, args.dtype);
  for (const auto& span : topology::crossHostSpans(k.end - k.begin, layout.hostSizes())) {
    if (span.owners[size_t(c.x.host())] != c.x.localRank()) {
      continue;
    }
    std::vector<int> members;
    for (int h = 0; h < layout.numHosts(); ++h) {
      members.push_back(layout.rankAt(h, span.owners[size_t(h)]));
    }
    std::sort(members.begin(), members.end());
    at::Tensor piece = flat.narrow(0, int64_t(k.begin + span.begin), int64_t(span.end - span.begin));
    std::vector<at::Tensor> tensors{glooView(piece)};
    c10d::AllreduceOptions opts;
    opts.reduceOp = glooOp;
    opts.timeout = c.x.remaining(c.op);
    c.x.countData(size_t(piece.numel()) * es);
    k.works.push_back(c.x.group(members)->allreduce(tensors, opts));
    k.owned.push_back(piece);
  }
}

// The rest of chunk k once its gloo operations are launched: waits for them, applies AVG's division to the
// spans this rank owns, and shares the chunk inside the host (step 4).
void finishChunk(Ctx c, char* base, size_t es, const kernels::ReduceArgs& args, Chunk& k) {
  for (const auto& work : k.works) {
    c.x.wait(work, c.op);
  }
  if (args.op == core::RedOp::kAvg) {
    for (auto& piece : k.owned) {
      if (core::isFloating(args.dtype)) {
        piece.div_(double(c.x.size()));
      } else {
        piece.copy_(piece.div(c.x.size(), "trunc"));  // integers truncate toward zero, as on one host
      }
    }
  }
  if (c.x.localSize() > 1) {
    shareInsideHost(c, base + k.begin * es, k.end - k.begin, es, k.slicing);
  }
}

}  // namespace

void allreduce(Ctx c, const at::Tensor& t, const kernels::ReduceArgs& args) {
  const at::Tensor flat = t.view({-1});
  const size_t count = size_t(flat.numel());
  const size_t es = size_t(flat.element_size());
  char* base = static_cast<char*>(flat.data_ptr());
  // Step 1/4: the leaders agree on what is being reduced.
  agreeAmongLeaders(c,
                    describe(shm::OpCode::kAllreduce, c.op.seq, int64_t(count), int(args.dtype), int(args.op), -1,
                             factorBits(args.factor)),
                    /*holdLocalRanks=*/false);
  kernels::ReduceArgs hostArgs = args;
  if (args.op == core::RedOp::kAvg) {
    hostArgs.op = core::RedOp::kSum;
  }
  if (c.x.localSize() == 1 && args.op == core::RedOp::kPremulSum) {
    flat.mul_(args.factor);  // a host of one rank: its term still gets the factor
  }
  // Steps 2-4, pipelined chunk by chunk (see the top of this file).
  auto chunks = pipelineChunks(count, c.x.layout().hostSizes(), c.options.chunkBytesFor(count * es) / es);
  Chunk* previous = nullptr;
  for (auto& k : chunks) {
    k.slicing = topology::HostSlicing::of(k.end - k.begin, c.x.localSize());
    if (c.x.localSize() > 1) {
      reduceInsideHost(c, base + k.begin * es, k.end - k.begin, es, k.slicing, hostArgs);
    }
    launchAcrossHosts(c, flat, es, args, k);
    if (previous != nullptr) {
      finishChunk(c, base, es, args, *previous);
    }
    previous = &k;
  }
  finishChunk(c, base, es, args, *previous);
}

}  // namespace tunedist::engine::hier
