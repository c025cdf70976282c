// The cross-host algorithms of the `tuned` backend: what each collective does when its group spans several
// hosts (CrossHost). Each takes contiguous staged tensors and runs on the backend's worker inside runCrossHost,
// so any failure reaches every rank of every host. The hot path is hierAllreduce (hier/allreduce.cpp); the other
// operations use simpler schemes (hier/collectives.cpp), correct for any layout of hosts.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <vector>

#include "backend/hier/cross_host.h"
#include "shm/comm.h"
#include "core/types.h"

namespace tunedist::hier {

// Everything a cross-host algorithm needs: the cross-host state and this host's shared-memory communicator.
struct Ctx {
  CrossHost& x;
  shm::ShmComm& comm;
  const shm::OpContext& op;
};

// The gloo form of a reduction: bools travel as uint8 (logical ops as MAX/MIN/BXOR), AVG and PREMUL_SUM as SUM
// (their division or factor is applied on our side).
at::Tensor glooView(const at::Tensor& t);
c10d::ReduceOp glooReduceOp(shm::RedOp op, shm::DType dtype);
// The metadata every participant must agree on: op code, seq, element count, dtype, reduce op, root, extra.
std::vector<int64_t> describe(shm::OpCode op, uint64_t seq, int64_t count, int dtype = 0, int redop = 0, int root = -1,
                              int64_t extra = 0);
const std::vector<const char*>& describeFields();
// Step 1 of every cross-host operation: the host leaders agree on `desc` in the leaders' gloo group. Every op does
// this first, in the same group, so hosts that call different operations meet there and fail naming both ops,
// instead of waiting in different groups until the timeout. With holdLocalRanks the other ranks of each host wait
// for their leader's verdict in a shared-memory barrier (a failure reaches them through the host's abort word)
// before they go on to gloo, where a group's creation could not be interrupted; all_reduce needs no barrier, its
// next step already waits for the leader in shared memory. Ops where other ranks hand data to gloo then agree
// among everyone as well.
void agreeAmongLeaders(Ctx c, const std::vector<int64_t>& desc, bool holdLocalRanks = true);

// In place on `t` (contiguous, 1-D view allowed).
void allreduce(Ctx c, const at::Tensor& t, const shm::ReduceArgs& args);
void broadcast(Ctx c, const at::Tensor& t, int root);
// `blocks[p]` receives rank p's `in`.
void allgather(Ctx c, const at::Tensor& in, const std::vector<at::Tensor>& blocks);
// `blocks` (size() tensors) on the root only.
void gather(Ctx c, const at::Tensor& in, const std::vector<at::Tensor>& blocks, int root);
void scatter(Ctx c, const std::vector<at::Tensor>& blocks, const at::Tensor& out, int root);
// Byte counts per peer; sends[p]/recvs[p] point into contiguous byte tensors `src`/`dst`.
void alltoallv(Ctx c, const at::Tensor& src, const std::vector<int64_t>& sendBytes, const at::Tensor& dst,
               const std::vector<int64_t>& recvBytes);
void barrier(Ctx c);

}  // namespace tunedist::hier
