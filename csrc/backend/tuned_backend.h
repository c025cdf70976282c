// TunedBackend: the `tuned` c10d backend. It routes each call, whole, by the device of its tensors, as torch's
// ProcessGroup keeps one backend per device type:
//   CPU tensors   -> CpuBackend (backend/cpu/): shared memory among the ranks of a host, gloo between hosts.
//   CUDA tensors  -> NcclSide (backend/cuda/): the backend torch makes for "nccl" (nccl2 on torch 2.15), created at
//                    the first CUDA call; every c10d call it supports is forwarded (tuned_backend_cuda.cpp).
// A call that mixes CPU and CUDA tensors is refused (and, for a collective, fails the CPU group so the peers do not
// wait for this rank). The router also keeps what spans both sides: coalescing blocks, timeouts, abort, split,
// and the group's membership, which reconfigure (reconfigure.cpp) replaces with a new set of processes.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/abort_hooks.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/device_scan.h"
#include "backend/cuda/nccl_side.h"

namespace tunedist {

class TunedBackend : public c10d::Backend {
 public:
  struct Options {
    cpu::CpuBackend::Options cpu;
    // Called when the NCCL side is created (the Python module logs NCCL's settings there).
    cuda::NcclSide::CreatedHook onNcclCreated;
    // Makes the NCCL side's backend (the Python module: torch's creator for "nccl"); empty: createNcclBackend.
    cuda::NcclSide::Factory ncclFactory;
    // init_process_group(enable_reconfigure=True): the group has no members until reconfigure() names them, and
    // every operation before that is refused.
    bool enableReconfigure = false;
    // This process's rank in the group it joined first (its global rank), kept through shrink and reconfigure and
    // carried in its reconfigure handle; -1: the rank given at creation.
    int64_t stableRank = -1;
    // The store under whose prefixes reconfigures meet; null: the group's own. A shrunk group keeps its parent's,
    // so a replacement that creates the job's group again (same store, same group name) finds the survivors.
    c10::intrusive_ptr<c10d::Store> reconfigureStore;
  };

  static c10::intrusive_ptr<c10d::Backend> create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  std::chrono::milliseconds timeout,
                                                  cuda::NcclSide::CreatedHook onNcclCreated = {},
                                                  engine::hier::GlooFactory glooFactory = nullptr,
                                                  bool enableReconfigure = false, int64_t stableRank = -1,
                                                  cuda::NcclSide::Factory ncclFactory = nullptr);

  TunedBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Options options);
  ~TunedBackend() override;

  const std::string getBackendName() const override { return "tuned"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
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
#ifdef TUNEDIST_C10D_HAS_GATHER_SINGLE
  c10::intrusive_ptr<c10d::Work> gather_single(at::Tensor& output, at::Tensor& input,
                                               const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
#elif defined(TUNEDIST_C10D_HAS_GATHER_INTO_TENSOR)
  c10::intrusive_ptr<c10d::Work> gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                                    const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
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
  // A host-side operation with no tensors: always the CPU side's.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks = false) override {
    requireMembers("monitored_barrier");
    cpu_->monitoredBarrier(opts, waitAllRanks);
  }

  bool supportsCoalescing() const override { return true; }
  // dist.split_group and DeviceMesh with a bound device split the parent group: the child is a TunedBackend over
  // the store torch hands over (members only; its engines and NCCL side are made lazily, like a new group's).
  bool supportsSplitting() const override { return true; }
  // Symmetric buffers: for CPU tensors the CPU side's (cpu::CpuBackend::allocateTensor), for a CUDA device the NCCL
  // side's (tuned_backend_cuda.cpp).
  bool supportsTensorAlloc(c10::DeviceIndex deviceIdx) override;
  at::Tensor allocateTensor(long size, at::TensorOptions options = {}) override;
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override;
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return cpu_->getSequenceNumberForGroup(); }
  void setTimeout(std::chrono::milliseconds timeout) override;

  // What spans both sides (tuned_backend_state.cpp). An ephemeral timeout extends both; the error state is the CPU
  // side's first failure, else the NCCL side's.
  void addEphemeralTimeout(const std::chrono::milliseconds& extra)
#ifdef TUNEDIST_C10D_HAS_EPHEMERAL_TIMEOUT
      override
#endif
      ;
  c10d::ErrorType getError() override;
  // pg._register_on_completion_hook: the CPU side's operations, and the NCCL side's where that backend takes the
  // hook (the classic ProcessGroupNCCL does, with TORCH_NCCL_ENABLE_TIMING=1; nccl2 takes keyed completion hooks
  // instead, as torch's own "nccl" group then does; a refusal is logged when the NCCL side is made).
  void registerOnCompletionHook(std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) override;
#ifdef TUNEDIST_C10D_HAS_COMPLETION_HOOKS
  // Keyed completion hooks are offered only where every device type this object serves reports them: always in a
  // build without NCCL, else when the NCCL side exists and its backend reports them too.
  bool supportsCompletionHooks() const override;
  void registerCompletionHook(int64_t hookId, c10d::CompletionHook hook) override;
  void unregisterCompletionHook(int64_t hookId) override;
#endif

  // Runs the abort hooks, then fails every operation of the group and stops it: whoever waits on it (a Work, a
  // receive, a monitored_barrier, the first operation's rendezvous) raises at once.
  void abort() override;
  void shutdown() override;
  void setGroupUid(const std::string& pgUid) override;

  // What the group forwards to its NCCL side beyond the collectives (tuned_backend_cuda.cpp). A call that names no
  // device goes to the NCCL side when the group is bound to a CUDA device (init_process_group(device_id=cuda:k):
  // torch then connects it at once, as it does "nccl"), else to the CPU side; a call that only a CUDA backend can
  // answer goes to the NCCL side: the memory allocator and tensor allocation for a CUDA device make it if need be;
  // time estimation, suspend/resume and memory statistics are refused, naming op and rank, where it has none.
  void eagerConnectSingleDevice(at::Device device) override;
#ifdef TUNEDIST_C10D_HAS_VIRTUAL_BOUND_DEVICE
  void setBoundDeviceId(std::optional<at::Device> device) override;
#endif
  void enableCollectivesTiming() override;
  void waitForPendingWorks() override;
  bool supportsTimeEstimation() const override;
#ifdef TUNEDIST_C10D_HAS_TIME_ESTIMATE
  void startTimeEstimate() override;
  float endTimeEstimate() override;
#endif
  std::shared_ptr<c10::Allocator> getMemAllocator() override;
#ifdef TUNEDIST_C10D_HAS_SUSPEND
  void suspend() override;
  void resume() override;
#endif
#ifdef TUNEDIST_C10D_HAS_MEMORY_STATS
  std::unordered_map<std::string, uint64_t> getMemoryStats() override;
#endif
#ifdef C10D_BACKEND_HAS_WINDOW
  // One-sided windows: a CUDA tensor's window is the NCCL side's, where that backend offers windows, and refused
  // naming it otherwise; a CPU tensor's is the CPU side's (CpuBackend::new_window: a window over the symmetric heap,
  // offered where every rank is on this host); without a tensor, the bound device's.
  bool supportsWindow() const override;
  c10::intrusive_ptr<c10d::Window> new_window(const std::optional<at::Tensor>& tensor = std::nullopt) override;
#endif

  // Fault tolerance (fault.cpp). dist.shrink_group: the survivors get a new group of the ranks that remain, over a
  // fresh prefix of this group's store (so that store must outlive the excluded ranks: torchrun's, or any not hosted
  // by one of them); SHRINK_ABORT aborts this group first.
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int64_t>& ranksToExclude, int shrinkFlags = 0,
      const c10::intrusive_ptr<c10d::Backend::Options>& optsOverride = nullptr) override;
  // Abort hooks run on this group's abort and its CPU failures, and are handed to the NCCL side where it takes them,
  // so its own watchdog runs them too (torch asks hooks to be idempotent for this).
#ifdef TUNEDIST_C10D_HAS_ABORT_HOOK_QUERY
  bool supportsAbortHooks() const override { return true; }
#endif
#ifdef C10D_BACKEND_HAS_HOOKS
  void registerAbortHook(int64_t hookId, c10d::AbortHook hook) override;
  void unregisterAbortHook(int64_t hookId) override;
#endif
#ifdef C10D_BACKEND_HAS_RECONFIGURE
  // Reconfigure (reconfigure.cpp), as torch defines it for gloo: each process hands out its handle, the handles are
  // exchanged out of band, and every member calls reconfigure with all of them and the same fresh uuid; the group
  // then runs on those members. Once the group's NCCL side exists, both sides are re-formed: the handle carries
  // both sides' handles, and each side is re-formed from its own part; an NCCL side that cannot be reconfigured
  // (the classic ProcessGroupNCCL) makes the group refuse.
  bool supportsReconfigure() const override;
  c10d::ReconfigureHandle get_reconfigure_handle() const override;
  c10::intrusive_ptr<c10d::Work> reconfigure(const c10d::ReconfigureOptions& opts) override;
  // The CPU side's part, which the two overrides above are made of: its handle
  // ("tuned:<rank>:<uuid>:<stable rank>:<instance>:<store address>"), and the switch to new members (ranks by
  // position in a list, by stable rank in a set), after which this group's rank and size are the CPU side's new
  // ones. A new CPU side is made for them, so the switch lives here and not in CpuBackend.
  c10d::ReconfigureHandle cpuReconfigureHandle() const;
  c10::intrusive_ptr<c10d::Work> reconfigureCpuSide(const c10d::ReconfigureOptions& opts);
#endif

  // The CPU side (for the bindings' queries: shared memory reserved, host layout, cross-host statistics).
  cpu::CpuBackend& cpu() { return *cpu_; }
  // The NCCL side if it was created (for tests and tools), else null.
  c10::intrusive_ptr<c10d::Backend> ncclBackend() const { return nccl_.existing(); }

 private:
  // The side that runs a call on these tensors: the CPU side, or the NCCL side for CUDA tensors. Refuses a call
  // that mixes CPU and CUDA tensors, and CUDA tensors in a build without NCCL, naming op and rank; with failGroup
  // (collectives) the refusal also fails the CPU group.
  template <typename... Tensors>
  c10d::Backend& route(const char* op, bool failGroup, const Tensors&... tensors) {
    requireMembers(op);
    cuda::DeviceScan scan;
    (scan.add(tensors), ...);
    return scan.cuda ? cudaSide(op, scan, failGroup) : *cpu_;
  }
  template <typename... Tensors>
  c10d::Backend& collective(const char* op, const Tensors&... tensors) {
    return route(op, true, tensors...);
  }
  c10d::Backend& cudaSide(const char* op, const cuda::DeviceScan& scan, bool failGroup);
  // Refuses `op` while the group waits for its first reconfigure (enable_reconfigure=True), naming op and rank.
  void requireMembers(const char* op) const {
    if (awaitingMembers_.load(std::memory_order_relaxed)) {
      refuseBeforeReconfigure(op);
    }
  }
  [[noreturn]] void refuseBeforeReconfigure(const char* op) const;
  // The CPU side of a new membership: re-registers the group's hooks and uid on it (reconfigure.cpp).
  void adoptCpuSide(c10::intrusive_ptr<cpu::CpuBackend> cpu);

  // The NCCL side for a call without tensors that only it can serve (created if need be), refusing by op and rank.
  c10d::Backend& cudaSideFor(const char* op);
  // The NCCL side if the group is bound to a CUDA device and it exists, else null: where a device-less call goes.
  c10::intrusive_ptr<c10d::Backend> boundCudaSide() const;
  // The NCCL side's part of shrink and of the abort hooks (tuned_backend_state.cpp): null where it has no backend or
  // cannot shrink (the new group then makes its own at its first CUDA call).
  c10::intrusive_ptr<c10d::Backend> shrinkNcclSide(const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
                                                   const c10::intrusive_ptr<c10d::Backend::Options>& optsOverride);
#ifdef C10D_BACKEND_HAS_HOOKS
  void forwardAbortHook(int64_t hookId, c10d::AbortHook hook);
  void forwardAbortHookRemoval(int64_t hookId);
#endif

  const cuda::NcclSide::CreatedHook onNcclCreated_;
  const cuda::NcclSide::Factory ncclFactory_;
  // The store under which each reconfigure's members meet (Options::reconfigureStore, else the group's).
  const c10::intrusive_ptr<c10d::Store> groupStore_;
  // The current membership's store: groupStore_, or the last reconfigure's prefix of it (shrink builds on it).
  c10::intrusive_ptr<c10d::Store> store_;
  // Shared with the CPU side's failure callback, which may run after this object is gone.
  const std::shared_ptr<AbortHooks> abortHooks_ = std::make_shared<AbortHooks>();
  std::atomic<uint64_t> shrinks_{0};  // shrink() calls so far: each new group's store prefix carries its number
  // Reconfigure state (reconfigure.cpp), under reconfigureMutex_ but for the flag read by every operation.
  std::atomic<bool> awaitingMembers_{false};
  mutable std::mutex reconfigureMutex_;
  int64_t stableRank_;
  int64_t uuid_ = -1;               // the uuid of the current membership; -1 before the first reconfigure
  std::vector<int64_t> usedUuids_;  // every uuid this process tried: none is used twice
  const uint64_t instanceId_;       // random: tells apart two processes that would have the same handle
  std::shared_ptr<std::function<void(std::shared_ptr<c10d::WorkInfo>)>> infoHook_;  // re-registered on a new CPU side
#ifdef TUNEDIST_C10D_HAS_COMPLETION_HOOKS
  std::map<int64_t, std::shared_ptr<c10d::CompletionHook>> completionHooks_;
#endif
  c10::intrusive_ptr<cpu::CpuBackend> cpu_;
  cuda::NcclSide nccl_;
  std::mutex mutex_;
  // torch's startCoalescing does not say which device follows; the NCCL side starts coalescing at the first CUDA
  // call inside the coalesced block.
  bool coalescing_ = false;
  bool ncclCoalescing_ = false;
};

}  // namespace tunedist
