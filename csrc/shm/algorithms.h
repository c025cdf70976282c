// The copying collectives of one host's group: free functions over the round protocol (shm/rounds.h), one file per
// collective. Counts are elements of args.dtype, sizes are bytes; each call blocks until the operation is done on this
// rank. ShmComm (shm/comm.h) is their public face.
#pragma once

#include <cstddef>

#include "core/op_context.h"
#include "kernels/reduce.h"

namespace tunedist::shm {

class Rounds;

// Entries: validate, then run the operation (Rounds::run) with its algorithm.
void allreduce(Rounds& r, const core::OpContext& ctx, const void* in, void* out, size_t count,
               const kernels::ReduceArgs& args);
void broadcast(Rounds& r, const core::OpContext& ctx, void* buf, size_t bytes, int root);
// `out` is written on the root only (may be null elsewhere).
void reduce(Rounds& r, const core::OpContext& ctx, const void* in, void* out, size_t count,
            const kernels::ReduceArgs& args, int root);
// outs[p] receives rank p's `bytes`; outs[rank] may equal `in`.
void allgather(Rounds& r, const core::OpContext& ctx, const void* in, size_t bytes, void* const* outs);
// outs (size() pointers) is used on the root only.
void gather(Rounds& r, const core::OpContext& ctx, const void* in, size_t bytes, void* const* outs, int root);
// ins (size() pointers) is used on the root only.
void scatter(Rounds& r, const core::OpContext& ctx, const void* const* ins, void* out, size_t bytes, int root);
// ins[p] (count elements each) is the block reduced into rank p's `out`; `out` may equal ins[rank].
void reduceScatter(Rounds& r, const core::OpContext& ctx, const void* const* ins, void* out, size_t count,
                   const kernels::ReduceArgs& args);
// Sends sendBytes[p] from sends[p] to rank p and receives recvBytes[p] into recvs[p]; every rank checks that every
// pair's sizes agree.
void alltoallv(Rounds& r, const core::OpContext& ctx, const void* const* sends, const size_t* sendBytes,
               void* const* recvs, const size_t* recvBytes);
void barrier(Rounds& r, const core::OpContext& ctx);

// Algorithm bodies, inside Rounds::run: the zero-copy collectives' copying path (shm/zero_copy/) runs them when the
// group votes against zero-copy.
void allreduceCopy(Rounds& r, const core::OpContext& ctx, const void* in, void* out, size_t count,
                   const kernels::ReduceArgs& args);
// gather to `root`, or to every rank (all_gather) when root is -1.
void gatherBody(Rounds& r, const core::OpContext& ctx, const void* in, size_t bytes, void* const* outs, int root);
void broadcastBody(Rounds& r, const core::OpContext& ctx, void* buf, size_t bytes, int root);
void reduceScatterBody(Rounds& r, const core::OpContext& ctx, const void* const* ins, void* out, size_t count,
                       const kernels::ReduceArgs& args);

}  // namespace tunedist::shm
