// HostCollectives: the engine interface of the CPU side. Each method moves the bytes of one collective among the
// ranks of a group whose tensors the CPU side (backend/cpu/) has already validated and staged: every tensor handed
// in is contiguous, and the CPU side copies results back into non-contiguous user tensors afterwards.
//
// Implementations, one chosen per group when its hosts are known (cpu::CpuBackend::makeEngines,
// backend/cpu/engines.cpp):
//   SymmetricHost (engine/symmetric_host.h)  every rank on this host: the zero-copy collectives (shm/zero_copy/) for
//                                            a large enough buffer in the symmetric heap, OneHost's copying ones for
//                                            every other call.
//   HierHost      (engine/hier/)             several hosts: shared memory inside each host, gloo between host leaders.
// OneHost (engine/one_host.h), every collective one call into the shared-memory communicator (shm::ShmComm), is the
// copying engine SymmetricHost holds; the backend never runs it on its own.
//
// Every method runs on the CPU side's executor (one operation at a time, in issue order) with the operation's
// context (name, sequence number, deadline), blocks until the operation is done on this rank, and throws
// tunedist::core::Error (TimeoutError, PeerDeadError) or c10::Error naming the op, the sequence and the ranks. After a
// failure the engine stays failed: later calls fail fast with the first cause.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/reduce.h"
#include "shm/comm.h"

namespace tunedist::engine {

// What a rank handed to gloo between hosts (HierHost); all zero on one host.
struct CrossHostStats {
  uint64_t dataBytes = 0;  // payload bytes this rank handed to gloo (all-reduce spans, broadcasts, ...)
  uint64_t metaBytes = 0;  // bytes of metadata agreement
  uint64_t glooOps = 0;
};

class HostCollectives {
 public:
  virtual ~HostCollectives() = default;

  // In place on `t`.
  virtual void allreduce(const core::OpContext& ctx, const at::Tensor& t, const kernels::ReduceArgs& args) = 0;
  virtual void broadcast(const core::OpContext& ctx, const at::Tensor& t, int root) = 0;
  // The result lands in `t` on the root; other ranks' `t` may be used as scratch only where the engine copied it.
  virtual void reduce(const core::OpContext& ctx, const at::Tensor& t, const kernels::ReduceArgs& args, int root) = 0;
  // blocks[p] receives rank p's `in` (same bytes). `in` never overlaps another rank's block; it may be our own.
  virtual void allgather(const core::OpContext& ctx, const at::Tensor& in, const std::vector<at::Tensor>& blocks) = 0;
  // As allgather, to the root only: `blocks` holds one tensor per rank on the root and is empty elsewhere.
  virtual void gather(const core::OpContext& ctx, const at::Tensor& in, const std::vector<at::Tensor>& blocks,
                      int root) = 0;
  // Rank p's `out` receives the root's blocks[p]; `blocks` is empty except on the root.
  virtual void scatter(const core::OpContext& ctx, const std::vector<at::Tensor>& blocks, const at::Tensor& out,
                       int root) = 0;
  // Reduces blocks[p] of every rank into rank p's `out`. Blocks may be non-contiguous views and may alias `out`.
  virtual void reduceScatter(const core::OpContext& ctx, const std::vector<at::Tensor>& blocks, const at::Tensor& out,
                             const kernels::ReduceArgs& args) = 0;
  // Sends sendBytes[p] bytes at sends[p] to rank p and receives recvBytes[p] bytes into recvs[p]; every pair's
  // sizes are checked to agree.
  virtual void alltoallv(const core::OpContext& ctx, const std::vector<const void*>& sends,
                         const std::vector<size_t>& sendBytes, const std::vector<void*>& recvs,
                         const std::vector<size_t>& recvBytes) = 0;
  virtual void barrier(const core::OpContext& ctx) = 0;

  // Fails the engine with `reason` on every rank that shares it (idempotent; the first reason wins).
  virtual void abort(const std::string& reason) = 0;
  // Bytes of shared memory this rank's host reserves for the group's collectives.
  virtual size_t reservedShmBytes() const = 0;
  // The shared-memory communicator of this host's ranks, for its statistics (read between operations).
  virtual const shm::ShmComm& hostComm() const = 0;
  // Bytes and operations this rank handed to gloo (several hosts only).
  virtual CrossHostStats crossHostStats() const { return {}; }
};

}  // namespace tunedist::engine
