// The cross-host algorithms of the `tuned` backend: what each collective does when its group spans several
// hosts (CrossHost), one file each in this folder; gloo.cpp holds the helpers they share. Each takes contiguous
// staged tensors and runs on the CPU side's executor inside runCrossHost (HierHost), so any failure reaches every
// rank of every host. The hot path is all_reduce (allreduce.cpp); the other operations use simpler schemes,
// correct for any layout of hosts.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <vector>

#include "backend/engine/hier/cross_host.h"
#include "core/options.h"
#include "core/types.h"
#include "shm/comm.h"

namespace tunedist::engine::hier {

// Everything a cross-host algorithm needs: the cross-host state and this host's shared-memory communicator.
struct Ctx {
  CrossHost& x;
  shm::ShmComm& comm;
  const core::OpContext& op;
  const core::CrossHostOptions& options;
};

// The gloo form of a reduction: bools travel as uint8 (logical ops as MAX/MIN/BXOR), AVG and PREMUL_SUM as SUM
// (their division or factor is applied on our side).
at::Tensor glooView(const at::Tensor& t);
c10d::ReduceOp glooReduceOp(core::RedOp op, core::DType dtype);
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
// The agreement of every op but all_reduce and all_to_all: the leaders first (agreeAmongLeaders), then all ranks.
void agreeEverywhere(Ctx c, const std::vector<int64_t>& desc);
// Flat gloo views of one block per rank: an all_gather's outputs, a gather or scatter root's blocks.
std::vector<at::Tensor> flatGlooViews(const std::vector<at::Tensor>& blocks);
int64_t bytesOf(const at::Tensor& t);
// Gloo options of type Opts whose timeout is what is left of the operation's deadline.
template <typename Opts>
Opts withTimeout(Ctx c) {
  Opts o;
  o.timeout = c.x.remaining(c.op);
  return o;
}

// In place on `t` (contiguous, 1-D view allowed).
void allreduce(Ctx c, const at::Tensor& t, const kernels::ReduceArgs& args);
void broadcast(Ctx c, const at::Tensor& t, int root);
// The result lands in `t` on the root; the other ranks reduce a copy.
void reduce(Ctx c, const at::Tensor& t, const kernels::ReduceArgs& args, int root);
// Reduces blocks[p] of every rank into rank p's `out` (contiguous).
void reduceScatter(Ctx c, const std::vector<at::Tensor>& blocks, const at::Tensor& out,
                   const kernels::ReduceArgs& args);
// `blocks[p]` receives rank p's `in`.
void allgather(Ctx c, const at::Tensor& in, const std::vector<at::Tensor>& blocks);
// `blocks` (size() tensors) on the root only.
void gather(Ctx c, const at::Tensor& in, const std::vector<at::Tensor>& blocks, int root);
void scatter(Ctx c, const std::vector<at::Tensor>& blocks, const at::Tensor& out, int root);
// Sends sendBytes[p] bytes at sends[p] to rank p and receives recvBytes[p] bytes into recvs[p]; every pair's sizes
// are checked to agree first.
void alltoallv(Ctx c, const std::vector<const void*>& sends, const std::vector<size_t>& sendBytes,
               const std::vector<void*>& recvs, const std::vector<size_t>& recvBytes);
void barrier(Ctx c);

}  // namespace tunedist::engine::hier
