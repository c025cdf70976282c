// CpuBackend: the CPU side of the `tuned` backend. TunedBackend (backend/tuned_backend.h) hands it every call whose
// tensors are on the CPU. Each collective validates its tensors on the caller's thread, stages non-contiguous ones,
// and queues one call into the group's HostCollectives engine on the executor; one file per collective in this
// folder. A caller error on one rank (a bad tensor, say) fails the group, so its peers stop waiting for that rank.
//
// Hosts: at creation every rank publishes a HostKey (one store write). At the group's first operation the ranks
// read each other's keys and group them (HostDiscovery) and make the engines (engines.cpp): on one host a
// SymmetricHost engine over every rank's shared memory (zero-copy on symmetric buffers, OneHost's copying algorithms
// otherwise), whose segment every rank must open (that verifies the host); on several
// hosts a HierHost engine (one ShmComm per host under its own store prefix, gloo between hosts), and the first
// collective verifies every host with a probe segment before anything else runs. Send and receive bypass the
// executor: they go to the HostP2p engine made beside the collectives' (OneHostP2p on one host, HierP2p on several:
// shared-memory rings for peers on this host, gloo pairs for the others; p2p.cpp).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/executor.h"
#include "backend/engine/hier/cross_host.h"
#include "backend/engine/host_collectives.h"
#include "backend/engine/host_p2p.h"
#include "core/options.h"
#include "shm/heap.h"
#include "shm/zero_copy/zero_copy.h"
#include "topology/host_topology.h"
#include "tunedist/tunedist.h"

namespace tunedist::topology {
class HostDiscovery;
}  // namespace tunedist::topology

namespace tunedist::cpu {

class StoreRendezvous;

class CpuBackend : public c10d::Backend {
 public:
  struct Options {
    std::chrono::milliseconds timeout = kDefaultTimeout;
    core::ShmOptions shm = core::ShmOptions::fromEnv();
    core::CrossHostOptions crossHost = core::CrossHostOptions::fromEnv();
    Executor::Options executor = Executor::Options::fromEnv();
    // Makes the gloo groups between hosts; only a group that spans several hosts calls it. Python sets it.
    engine::hier::GlooFactory glooFactory;
  };

  CpuBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Options options);
  ~CpuBackend() override;

  const std::string getBackendName() const override { return "tuned"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  // A sparse COO tensor is summed as gloo does (allreduce_sparse.cpp); torch sends it to allreduce_sparse.
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override {
    return allreduce(tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  // Every rank's input into one flat output on the root (gather_single.cpp), under the name this torch's Backend
  // declares (cmake/tunedistTorchFeatures.cmake).
  c10::intrusive_ptr<c10d::Work> gatherSingle(at::Tensor& output, at::Tensor& input, const c10d::GatherOptions& opts);
#ifdef TUNEDIST_C10D_HAS_GATHER_SINGLE
  c10::intrusive_ptr<c10d::Work> gather_single(at::Tensor& output, at::Tensor& input,
                                               const c10d::GatherOptions& opts = c10d::GatherOptions()) override {
    return gatherSingle(output, input, opts);
  }
#elif defined(TUNEDIST_C10D_HAS_GATHER_INTO_TENSOR)
  c10::intrusive_ptr<c10d::Work> gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                                    const c10d::GatherOptions& opts = c10d::GatherOptions()) override {
    return gatherSingle(output, input, opts);
  }
#endif
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
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
  // Blocks until every rank arrived or the timeout passed; rank 0 names the ranks that did not arrive
  // (monitored_barrier.cpp).
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks = false) override;

  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override { executor_->startCoalescing(); }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  // Works recorded by the open coalescing block so far.
  size_t coalescedCount() { return executor_->coalescedCount(); }

  uint64_t getSequenceNumberForGroup() override { return executor_->lastSeq(); }
  void setTimeout(std::chrono::milliseconds timeout) override;
  // Adds `extra` to the timeout of every operation issued from now on, until the first of them has completed
  // (dist.distributed_c10d._add_ephemeral_timeout_for_all_pgs; ephemeral_timeout.cpp). Calls accumulate, and each
  // expires on its own.
  void addEphemeralTimeout(const std::chrono::milliseconds& extra)
#ifdef TUNEDIST_C10D_HAS_EPHEMERAL_TIMEOUT
      override
#endif
      ;
  // The timeout an operation gets: `requested` where set, else the group's; plus the live ephemeral extensions.
  std::chrono::milliseconds effectiveTimeout(std::chrono::milliseconds requested) const;
  // The group's error state (Executor::error): SUCCESS until an operation failed.
  c10d::ErrorType getError() override { return executor_->error(); }

  // Completion hooks (completion_hooks.h): the operations that run on the executor, and send and receive, which
  // bypass it (p2p.cpp reports them), as ProcessGroupNCCL reports its point-to-point Works.
  void registerOnCompletionHook(std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) override {
    executor_->hooks().setInfoHook(std::move(hook));
  }
  void waitForPendingWorks() override { executor_->hooks().drain(); }
  // Operations are always timed where a hook is registered; nothing to switch on.
  void enableCollectivesTiming() override {}
#ifdef TUNEDIST_C10D_HAS_COMPLETION_HOOKS
  bool supportsCompletionHooks() const override { return true; }
  void registerCompletionHook(int64_t hookId, c10d::CompletionHook hook) override {
    executor_->hooks().addKeyed(hookId, [hook = std::move(hook)](uint64_t key, std::optional<float> ms) {
      hook(c10d::CompletionHookArgs{key, ms});
    });
  }
  void unregisterCompletionHook(int64_t hookId) override { executor_->hooks().removeKeyed(hookId); }
#endif
  Options options() const;
  void abort() override;
  void shutdown() override;
  // After shutdown() or abort().
  bool isShutDown();
  // Called (on the thread that ran it) when a collective fails or times out, before its Work reports the error:
  // the group's abort hooks. Set once, before the first operation.
  void setFailureCallback(std::function<void()> callback) { failureCallback_ = std::move(callback); }

  // Symmetric buffers (symmetric.cpp): a CPU tensor of `size` elements from this rank's symmetric heap, whose
  // collectives run zero-copy when every rank's buffer is one (FSDP2's set_allocate_memory_from_process_group_for_comm,
  // tunedist.symmetric_empty). The heap outlives the group while such tensors live.
  bool supportsTensorAlloc(c10::DeviceIndex deviceIdx) override { return deviceIdx < 0; }
#ifdef C10D_BACKEND_HAS_WINDOW
  // One-sided windows of CPU tensors over the symmetric heap, where every rank is on this host (window.cpp).
  bool supportsWindow() const override;
  c10::intrusive_ptr<c10d::Window> new_window(const std::optional<at::Tensor>& tensor = std::nullopt) override;
#endif
  at::Tensor allocateTensor(long size, at::TensorOptions options = {}) override;
  // Whether `t`'s bytes lie in this rank's symmetric heap.
  bool isSymmetric(const at::Tensor& t) const;
  shm::HeapStats heapStats() const { return heap_->stats(); }
  // This rank's heap, for torch's symmetric-memory allocator (backend/cpu/symm_mem/), which hands out its blocks.
  const std::shared_ptr<shm::SymmetricHeap>& heap() const { return heap_; }
  // Collective, ordered with the group's other operations: every rank's `bytes` at `ptr` (in its heap), mapped here
  // (torch's symm_mem.rendezvous and c10d windows, backend/cpu/symm_mem/). Refused, failing the group so peers do
  // not wait, when `ptr` is not in this rank's heap; refused on a group that spans hosts.
  shm::zero_copy::SymmetricPeers exchangeSymmetric(const char* op, const char* title, void* ptr, size_t bytes,
                                                   std::chrono::milliseconds timeout);
  // The least buffer that may run zero-copy in a one-host group (groups spanning hosts always copy): from there the
  // group measures the path, or with TUNEDIST_SYMMETRIC_MIN_BYTES set, runs zero-copy.
  size_t symmetricMinBytes() const { return options().shm.zeroCopyMinBytes(); }

  // Bytes of shared memory this group reserves at its first collective (on one host; per host when it spans
  // several, once the group has run an operation).
  size_t reservedShmBytes() const;
  // This host's shared-memory communicator once the group has run an operation (its host layout known), else null.
  // For statistics, read between operations: after a synchronous call or a Work's wait().
  const shm::ShmComm* hostComm() const;
  // The group's layout of hosts, found at its first operation (blocks until every rank has published its key).
  const topology::HostLayout& hostLayout(std::chrono::steady_clock::time_point deadline);
  // Bytes and operations this rank handed to gloo; all zero on one host.
  engine::CrossHostStats crossHostStats() const;

  // Fails the group with `message` on behalf of a caller error found on this rank before any communication, so
  // the peers do not wait for us; then throws it. Names the op and rank.
  [[noreturn]] void rejectCall(const char* op, const std::string& message);

 private:
  // Runs `checks`; if one throws, fails the group (rejectCall) so peers do not wait, and rethrows.
  template <typename F>
  void guardCall(const char* op, F&& checks);
  // Queues one collective on the executor; `body(engine, ctx)` runs it with the engine and the operation's context.
  // A template, so the body and the engine lookup are one callable that an inline call runs as it is (no
  // allocation; a queued call pays one, for the executor's Body).
  template <typename Body>
  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, const char* name, std::vector<at::Tensor> outputs,
                                        const std::vector<at::Tensor>& inputs, bool asyncOp,
                                        std::chrono::milliseconds timeout, size_t bytes, Body&& body);

  // Engines (engines.cpp).
  void makeEngines(const topology::HostLayout& layout);
  // Before a collective: the layout, verified by the probe once per group.
  void prepareCollective(const core::OpContext& ctx);
  // Fails every engine that exists with `reason` (and, once they exist, the ones made later).
  void abortEngines(const std::string& reason);

  // all_reduce of one sparse COO tensor (allreduce_sparse.cpp).
  c10::intrusive_ptr<c10d::Work> allreduceSparse(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts);

  // Point-to-point (p2p.cpp).
  c10::intrusive_ptr<c10d::Work> startRecv(const at::Tensor& t, int srcRank, int tag);
  // The send/recv engine, once the group's layout is known (made with the collectives' engine).
  engine::HostP2p& p2pEngine();

  c10::intrusive_ptr<c10d::Store> store_;
  Options options_;  // timeout under optionsMutex_
  mutable std::mutex optionsMutex_;
  std::shared_ptr<StoreRendezvous> rendezvous_;
  std::unique_ptr<topology::HostDiscovery> discovery_;
  std::shared_ptr<Executor> executor_;

  std::mutex topoMutex_;
  std::atomic<bool> layoutReady_{false};
  std::optional<topology::HostLayout> layout_;  // set once, under topoMutex_
  bool verified_ = false;                       // collectives' thread only
  std::string verifyError_;
  std::string pendingAbort_;  // an abort() before the engines existed, under topoMutex_
  std::unique_ptr<engine::HostCollectives> engine_;
  std::shared_ptr<shm::SymmetricHeap> heap_;
  std::unique_ptr<engine::HostP2p> p2p_;
  std::atomic<uint64_t> p2pSeq_{0};
  std::atomic<uint64_t> monitoredBarriers_{0};  // calls so far: each call's store keys carry its number
  std::function<void()> failureCallback_;

  // Ephemeral timeout extensions (ephemeral_timeout.cpp), under optionsMutex_. An extension binds to the Work of the
  // first operation issued after it and expires once that Work has completed; a synchronous call that returned no
  // Work had completed on return.
  struct EphemeralTimeout {
    std::chrono::milliseconds extra;
    bool bound = false;
    c10::intrusive_ptr<c10d::Work> first;
  };
  // After a launch: binds the unbound extensions to `work` (null: the call completed already, so they expire).
  void bindEphemeral(const c10::intrusive_ptr<c10d::Work>& work);
  // The sum of the live extensions, dropping the expired ones; with optionsMutex_ held.
  std::chrono::milliseconds ephemeralLocked() const;
  mutable std::vector<EphemeralTimeout> ephemeral_;
  mutable std::atomic<bool> hasEphemeral_{false};  // whether ephemeral_ may be non-empty: launch checks only this
};

template <typename Body>
c10::intrusive_ptr<c10d::Work> CpuBackend::launch(c10d::OpType type, const char* name, std::vector<at::Tensor> outputs,
                                                  const std::vector<at::Tensor>& inputs, bool asyncOp,
                                                  std::chrono::milliseconds timeout, size_t bytes, Body&& body) {
  // The engine exists once prepareCollective has run, which the executor does before every body.
  auto work = executor_->launch(type, name, std::move(outputs), inputs, asyncOp, effectiveTimeout(timeout), bytes,
                                [this, body = std::forward<Body>(body)](const core::OpContext& ctx) mutable {
                                  try {
                                    body(*engine_, ctx);
                                  } catch (...) {
                                    if (failureCallback_) {
                                      failureCallback_();
                                    }
                                    throw;
                                  }
                                });
  if (hasEphemeral_.load(std::memory_order_relaxed)) {
    bindEphemeral(work);
  }
  return work;
}

template <typename F>
void CpuBackend::guardCall(const char* op, F&& checks) {
  try {
    checks();
  } catch (const c10::Error& e) {
    rejectCall(op, e.what_without_backtrace());
  } catch (const std::exception& e) {
    rejectCall(op, e.what());
  }
}

}  // namespace tunedist::cpu
