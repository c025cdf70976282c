// ShmComm: the collectives of one process group among the ranks of one host, over one shared-memory segment. The
// public face of the one-host engine; its parts are types of their own:
//   Rounds              (shm/rounds.h)           the round protocol, over the group's segment (GroupSegment:
//                                                attach, heartbeat, failure) and its store policy (StorePolicy);
//   the copying algorithms (shm/algorithms.h)    free functions over Rounds, one file per collective;
//   ZeroCopyCollectives (shm/zero_copy/)         the collectives on symmetric-heap buffers, present with a heap.
#pragma once

#include <memory>
#include <string>

#include "core/error.h"
#include "core/op_context.h"
#include "core/options.h"
#include "core/rendezvous.h"
#include "core/types.h"
#include "kernels/reduce.h"
#include "shm/descriptor.h"
#include "shm/heap.h"
#include "shm/store_policy.h"

namespace tunedist::shm {

class Rounds;
namespace zero_copy {
class ZeroCopyCollectives;
}  // namespace zero_copy

class ShmComm {
 public:
  // `heap` (may be null) is this rank's symmetric heap: zeroCopy() runs collectives on buffers in it.
  ShmComm(std::shared_ptr<core::Rendezvous> rendezvous, int rank, int size, core::ShmOptions options,
          std::shared_ptr<SymmetricHeap> heap = nullptr);
  ~ShmComm();
  ShmComm(const ShmComm&) = delete;
  ShmComm& operator=(const ShmComm&) = delete;

  int rank() const;
  int size() const;
  const core::ShmOptions& options() const;
  // Bytes this group reserves in /dev/shm at its first collective.
  size_t reservedBytes() const;
  bool attached() const;

  // Collectives on raw host memory (shm/algorithms.h says what each takes). Counts are elements of args.dtype, sizes
  // are bytes. Each blocks until done.
  void allreduce(const core::OpContext& ctx, const void* in, void* out, size_t count, const kernels::ReduceArgs& args);
  void broadcast(const core::OpContext& ctx, void* buf, size_t bytes, int root);
  void reduce(const core::OpContext& ctx, const void* in, void* out, size_t count, const kernels::ReduceArgs& args,
              int root);
  void allgather(const core::OpContext& ctx, const void* in, size_t bytes, void* const* outs);
  void gather(const core::OpContext& ctx, const void* in, size_t bytes, void* const* outs, int root);
  void scatter(const core::OpContext& ctx, const void* const* ins, void* out, size_t bytes, int root);
  void reduceScatter(const core::OpContext& ctx, const void* const* ins, void* out, size_t count,
                     const kernels::ReduceArgs& args);
  void alltoallv(const core::OpContext& ctx, const void* const* sends, const size_t* sendBytes, void* const* recvs,
                 const size_t* recvBytes);
  void barrier(const core::OpContext& ctx);

  // The zero-copy collectives on this rank's symmetric heap; null without a heap.
  zero_copy::ZeroCopyCollectives* zeroCopy() const { return zeroCopy_.get(); }

  // Each collective family's RoundStoreChooser (shm/store_policy.h), for statistics and tests.
  const RoundStoreChooser& roundStoreChooser(StorePolicy::Family family) const;
  // Only from the thread that runs this rank's operations, between them.
  RoundStoreChooser& roundStoreChooser(StorePolicy::Family family);

  // Marks the group failed with `reason` (shared with all ranks, with its kind) and wakes every waiter. The first
  // failure wins; later calls only share it again. Idempotent.
  void abort(const std::string& reason, core::FailureKind kind = core::FailureKind::kError);
  // Throws the stored failure if the group has failed (locally or through a peer's abort).
  void throwIfFailed();
  bool failed() const;

 private:
  // Declared first: the zero-copy collectives run on it and are destroyed before it.
  std::unique_ptr<Rounds> rounds_;
  std::unique_ptr<zero_copy::ZeroCopyCollectives> zeroCopy_;
};

}  // namespace tunedist::shm
