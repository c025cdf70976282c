// TunedBackend: the `tuned` c10d backend. CPU tensors go through the shared-memory engine (shm::ShmComm) among
// the ranks of this host; a group that spans several hosts adds gloo between hosts (CrossHost, hier/); CUDA
// tensors go to the NCCL side (cuda/nccl_side.h), a wrapped ProcessGroupNCCL. Every entry point first asks
// cudaSide() where its tensors live; a call that mixes CPU and CUDA tensors is refused.
//
// Hosts: at creation every rank publishes a HostKey (one store write). At the group's first operation the ranks
// read each other's keys and group them (HostDiscovery) and make the engines: on one host exactly as before
// (every rank in one ShmComm, whose segment every rank must open: that verifies the host); on several, one
// ShmComm per host under its own store prefix plus a CrossHost, and the first collective verifies every host with
// a probe segment before anything else runs.
//
// Execution: every call validates its tensors on the caller's thread, takes the next per-group sequence number
// and queues the operation; one worker thread runs operations in issue order, so DDP's bucket all-reduces overlap
// the backward pass. A synchronous call (async_op=False) with nothing queued runs inline on the caller's thread,
// which saves the hand-off latency. A caller error on one rank (a bad tensor, say) aborts the group, so its
// peers fail instead of waiting for it.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/device_scan.h"
#include "backend/cuda/nccl_side.h"
#include "backend/hier/cross_host.h"
#include "backend/hier/hier_ops.h"
#include "backend/hier/p2p.h"
#include "backend/work.h"
#include "shm/comm.h"
#include "topology/host_discovery.h"
#include "shm/p2p/engine.h"

namespace tunedist {

class StoreRendezvous;

class TunedBackend : public c10d::Backend {
 public:
  struct Options {
    std::chrono::milliseconds timeout = std::chrono::milliseconds(30 * 60 * 1000);
    shm::ShmOptions shm = shm::ShmOptions::fromEnv();
    // Synchronous calls up to this many bytes may run inline on the caller's thread when nothing is queued.
    size_t inlineMaxBytes = size_t(64) << 20;
    // Called when the NCCL side is created (the Python module logs NCCL's settings there).
    NcclSide::CreatedHook onNcclCreated;
    // Makes the gloo groups between hosts; only a group that spans several hosts calls it. Python sets it.
    GlooFactory glooFactory;
  };

  static c10::intrusive_ptr<c10d::Backend> create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  std::chrono::milliseconds timeout,
                                                  NcclSide::CreatedHook onNcclCreated = {},
                                                  GlooFactory glooFactory = nullptr);

  TunedBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Options options);
  ~TunedBackend() override;

  const std::string getBackendName() const override { return "tuned"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  bool supportsCoalescing() const override { return true; }
  // dist.split_group and DeviceMesh with a bound device split the parent group: the child is a TunedBackend over
  // the store torch hands over (members only; its engines and NCCL side are made lazily, like a new group's).
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override;
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override;
  void setTimeout(std::chrono::milliseconds timeout) override;
  void abort() override;
  void shutdown() override;
  void setGroupUid(const std::string& pgUid) override;

  // The backend for this call's tensors: null for CPU tensors (the caller goes on with shared memory), the NCCL
  // side for CUDA tensors. Refuses a call that mixes CPU and CUDA tensors, and CUDA tensors in a build without
  // NCCL, naming op and rank; with failGroup (collectives) the refusal also fails the CPU group, as rejectCall.
  template <typename... Tensors>
  c10d::Backend* cudaSide(const char* op, const Tensors&... tensors) {
    DeviceScan scan;
    (scan.add(tensors), ...);
    return scan.cuda ? cudaSideFor(op, scan, true) : nullptr;
  }
  template <typename... Tensors>
  c10d::Backend* cudaSideP2p(const char* op, const Tensors&... tensors) {
    DeviceScan scan;
    (scan.add(tensors), ...);
    return scan.cuda ? cudaSideFor(op, scan, false) : nullptr;
  }
  // The NCCL side if it was created (for tests and tools), else null.
  c10::intrusive_ptr<c10d::Backend> ncclBackend() const { return nccl_.existing(); }

  // Bytes of shared memory this group reserves at its first collective (on one host; per host when it spans
  // several, once the group has run an operation).
  size_t reservedShmBytes() const;

  // The group's layout of hosts, found at its first operation (blocks until every rank has published its key).
  const shm::HostLayout& hostLayout(std::chrono::steady_clock::time_point deadline);
  // The cross-host state; null while the group runs on one host (or before its first operation).
  CrossHost* crossHost() { return cross_.get(); }
  // Bytes and operations this rank handed to gloo; all zero on one host.
  CrossHostStats crossHostStats() const { return cross_ ? cross_->stats() : CrossHostStats{}; }
  // This rank's shared-memory position of group rank `peer`, or -1 when `peer` is on another host.
  int localPeer(int peer) const;
  // The group rank at shared-memory position `local` of this rank's host.
  int groupRankOnHost(int local) const;
  // Send/recv with ranks on other hosts, made at first use.
  hier::CrossHostP2p& crossP2p();

  // What one operation runs on the worker (or inline); gets the operation's context with its deadline.
  using Body = std::function<void(const shm::OpContext&)>;

  // Queues (or runs inline) one operation and returns its Work. `name` is the profiler title ("tuned:all_reduce").
  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, const char* name, std::vector<at::Tensor> outputs,
                                        const std::vector<at::Tensor>& inputs, bool asyncOp,
                                        std::chrono::milliseconds timeout, size_t bytes, Body body);

  shm::ShmComm& comm() { return *comm_; }
  // The context of a cross-host algorithm (hier/hier_ops.h).
  hier::Ctx hierCtx(const shm::OpContext& ctx) { return hier::Ctx{*cross_, *comm_, ctx}; }
  // Runs `body` as a cross-host phase of ctx (runCrossHost): failures reach every host.
  void runHier(const shm::OpContext& ctx, const std::function<void()>& body);
  shm::P2pEngine& p2p() { return *p2p_; }
  // Records a Work made outside launch() (send/recv) in the coalesced group being built, if any.
  void trackWork(const c10::intrusive_ptr<c10d::Work>& work);
  uint64_t nextP2pSeq() { return ++p2pSeq_; }
  std::chrono::milliseconds effectiveTimeout(std::chrono::milliseconds requested) const;
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Fails the group with `message` on behalf of a caller error found on this rank before any communication, so
  // the peers do not wait for us; then throws it. Names the op and rank.
  [[noreturn]] void rejectCall(const char* op, const std::string& message);

 private:
  struct Item {
    c10::intrusive_ptr<TunedWork> work;
    Body body;
    std::chrono::milliseconds timeout;
    const char* name;
  };

  void workerLoop();
  // Runs the operation's body; returns its failure, if any.
  std::exception_ptr execute(Item& item);
  // Completes the operation's Work (runs its future's callbacks).
  void settle(Item& item, std::exception_ptr error);
  // Called with mutex_ held from a callback on the worker thread: hands the queue to a fresh worker thread.
  void retireWorkerLocked();
  void releaseEngineLocked();
  void helpUntil(const TunedWork& work);
  void runNextLocked(std::unique_lock<std::mutex>& lock);
  void runLocked(Item& item, std::unique_lock<std::mutex>& lock);
  c10d::Backend* cudaSideFor(const char* op, const DeviceScan& scan, bool failGroup);
  // Makes the engines once the layout is known (topology.cpp).
  void makeEngines(const shm::HostLayout& layout);
  // Before a collective: the layout, verified by the probe once per group.
  void prepareCollective(const shm::OpContext& ctx);
  // Fails every engine that exists with `reason` (and, once they exist, the ones made later).
  void abortEngines(const std::string& reason);

  c10::intrusive_ptr<c10d::Store> store_;
  Options options_;
  std::shared_ptr<StoreRendezvous> rendezvous_;
  std::unique_ptr<shm::HostDiscovery> discovery_;
  std::mutex topoMutex_;
  std::atomic<bool> layoutReady_{false};
  std::optional<shm::HostLayout> layout_;  // set once, under topoMutex_
  bool verified_ = false;                  // collectives' thread only
  std::string verifyError_;
  std::string pendingAbort_;  // an abort() before the engines existed, under topoMutex_
  std::unique_ptr<shm::ShmComm> comm_;
  std::unique_ptr<shm::P2pEngine> p2p_;
  std::shared_ptr<CrossHost> cross_;
  std::unique_ptr<hier::CrossHostP2p> crossP2p_;  // under topoMutex_

  uint64_t seq_ = 0;  // guarded by mutex_
  std::atomic<uint64_t> p2pSeq_{0};

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread worker_;
  std::vector<std::thread> retired_;  // former workers, still inside future callbacks or finishing them

  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;
  // torch's startCoalescing does not say which device follows; the NCCL side starts coalescing at the first CUDA
  // call inside the coalesced block.
  bool ncclCoalescing_ = false;  // guarded by mutex_

  NcclSide nccl_;
};

}  // namespace tunedist
