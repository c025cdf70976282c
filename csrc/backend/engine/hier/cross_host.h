// CrossHost: the part of a `tuned` group that spans several hosts. Inside each host the group's operations run
// on shared memory (the backend's ShmComm over the host's ranks); between hosts they go through gloo process
// groups that this class creates lazily, from the group's store, one per set of member ranks.
//
// Rules every cross-host operation follows (hier/*.cpp):
//   * Before any data reaches gloo, the ranks that will exchange it agree on the operation's metadata (agree()):
//     a fixed-size descriptor is all-gathered, so gloo never sees disagreeing sizes (it aborts the process on a
//     size mismatch) and the error is an exception naming the op, its sequence number and the ranks.
//   * Zero-element pieces never reach gloo (some gloo calls crash on them).
//   * A failure anywhere (gloo error, timeout, a disagreement, a dead rank) is shared twice: through the host's
//     shared-memory abort word (the caller's fail()) and through the group's store (kAbortKey), which ranks
//     waiting on gloo poll, so every rank of every host fails with the first cause instead of waiting for the
//     timeout. A failed group keeps failing fast with that cause.
//   * Gloo groups of a failed group are abandoned, not destroyed: gloo's destructor would wait for operations
//     stuck on dead or failed peers, and destroy_process_group must never wait on a dead host.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backend/engine/host_collectives.h"
#include "shm/comm.h"
#include "topology/host_topology.h"

namespace tunedist::engine::hier {

// Creates a c10d gloo backend over `store` for `rank` of `size` (honouring GLOO_SOCKET_IFNAME) with `timeout`.
using GlooFactory = std::function<c10::intrusive_ptr<c10d::Backend>(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout)>;

class CrossHost {
 public:
  CrossHost(c10::intrusive_ptr<c10d::Store> store, int rank, topology::HostLayout layout, GlooFactory factory,
            std::chrono::milliseconds timeout);
  ~CrossHost();

  const topology::HostLayout& layout() const { return layout_; }
  int rank() const { return rank_; }
  int size() const { return int(layout_.hostOf.size()); }
  int host() const { return layout_.hostOf[size_t(rank_)]; }
  int localRank() const { return layout_.localRankOf[size_t(rank_)]; }
  int localSize() const { return int(layout_.hosts[size_t(host())].size()); }
  // Group ranks of position 0 of every host, in host order.
  std::vector<int> leaders() const;
  std::vector<int> everyone() const;

  // The gloo group of `members` (ascending group ranks, including ours), created at first use. Every member asks
  // for it first in the same operation, so creation cannot deadlock. Our gloo rank is our index in `members`.
  // `kind` keeps groups of the same ranks apart (point-to-point pairs use their own).
  c10::intrusive_ptr<c10d::Backend> group(const std::vector<int>& members, const std::string& kind = "c");
  int indexIn(const std::vector<int>& members) const;

  // Waits for a gloo Work until ctx's deadline, watching for a failure shared by another host; rethrows errors.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const core::OpContext& ctx);
  // All-gathers `desc` (the same length on every member) among `members`; returns every member's, in order.
  std::vector<std::vector<int64_t>> gatherDescs(const std::vector<int>& members, const core::OpContext& ctx,
                                                const std::vector<int64_t>& desc);
  // gatherDescs, then throws if any member's desc differs from ours, naming the fields and ranks.
  void agree(const std::vector<int>& members, const core::OpContext& ctx, const std::vector<int64_t>& desc,
             const std::vector<const char*>& fieldNames);

  void countData(size_t bytes) { dataBytes_.fetch_add(bytes, std::memory_order_relaxed); }
  CrossHostStats stats() const;

  // Throws the recorded failure (ours or another host's) if there is one.
  void throwIfFailed(const core::OpContext& ctx);
  // Records `message` as the group's failure and shares it with the other hosts through the store.
  void fail(const std::string& message);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // The failure a rank recorded in the store, if any; throws what the store throws when it cannot be reached.
  std::string recordedFailure();
  std::chrono::milliseconds remaining(const core::OpContext& ctx) const;

 private:
  void checkRemoteAbort();

  c10::intrusive_ptr<c10d::Store> store_;
  const int rank_;
  const topology::HostLayout layout_;
  GlooFactory factory_;
  const std::chrono::milliseconds timeout_;

  std::mutex mutex_;
  // Each group once: the first thread to ask creates it, and any other thread of this rank that asks meanwhile (a
  // pair's send lane and receive lane) waits for that creation. Two creations of one group by one rank would both
  // meet the peer's under the same store prefix, and gloo's rendezvous would pair them wrongly.
  std::map<std::pair<std::string, std::vector<int>>, std::shared_future<c10::intrusive_ptr<c10d::Backend>>> groups_;

  std::atomic<uint64_t> dataBytes_{0};
  std::atomic<uint64_t> metaBytes_{0};
  std::atomic<uint64_t> glooOps_{0};

  std::atomic<bool> failed_{false};
  std::mutex failMutex_;
  std::string failure_;
};

// Runs `body` (a cross-host phase of operation ctx); any exception becomes the group's failure: recorded in `x`,
// shared with the other hosts, and handed to `abortLocal` (the host's ShmComm::abort) before it is rethrown as a
// tunedist::core::Error naming the op, seq and rank. A connection that closed is often the consequence of a failure
// elsewhere (the ranks that raised it leave): for up to kFirstCauseGrace the rank then looks in the store for the
// first cause that rank recorded, and reports it if it comes.
inline constexpr std::chrono::milliseconds kFirstCauseGrace{500};
void runCrossHost(CrossHost& x, const core::OpContext& ctx, const std::function<void(const std::string&)>& abortLocal,
                  const std::function<void()>& body);

}  // namespace tunedist::engine::hier
