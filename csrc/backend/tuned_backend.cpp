// TunedBackend: routing by device, coalescing across both sides, and what a group does as a whole (timeouts,
// abort, shutdown, split).
#include "backend/tuned_backend.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <random>
#include <utility>

#include "tunedist/tunedist.h"

#ifndef TUNEDIST_TORCH_VERSION
#define TUNEDIST_TORCH_VERSION "unknown"
#endif
#ifndef TUNEDIST_VERSION
#define TUNEDIST_VERSION "unknown"
#endif

namespace tunedist {

c10::intrusive_ptr<c10d::Backend> createBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                std::chrono::milliseconds timeout) {
  return TunedBackend::create(store, rank, size, timeout);
}

std::string versionString() {
  return std::string("tunedist ") + TUNEDIST_VERSION + " (torch " + TUNEDIST_TORCH_VERSION + ")";
}

c10::intrusive_ptr<c10d::Backend> TunedBackend::create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                       std::chrono::milliseconds timeout,
                                                       cuda::NcclSide::CreatedHook onNcclCreated,
                                                       engine::hier::GlooFactory glooFactory, bool enableReconfigure,
                                                       int64_t stableRank, cuda::NcclSide::Factory ncclFactory) {
  Options options;
  options.enableReconfigure = enableReconfigure;
  options.stableRank = stableRank;
  if (timeout.count() > 0) {
    options.cpu.timeout = timeout;
  }
  options.onNcclCreated = std::move(onNcclCreated);
  options.cpu.glooFactory = std::move(glooFactory);
  options.ncclFactory = std::move(ncclFactory);
  return c10::make_intrusive<TunedBackend>(store, rank, size, std::move(options));
}

namespace {

uint64_t randomInstanceId() {
  std::random_device device;
  return (uint64_t(device()) << 32) ^ uint64_t(device());
}

}  // namespace

// In the reconfigure regime the CPU side until the first reconfigure is a placeholder over a store of its own: it
// keeps the group's settings (timeout, hooks) but takes no part in anything, since every operation is refused.
TunedBackend::TunedBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Options options)
    : c10d::Backend(rank, size),
      onNcclCreated_(options.onNcclCreated),
      ncclFactory_(options.ncclFactory),
      groupStore_(options.reconfigureStore ? options.reconfigureStore : store),
      store_(options.enableReconfigure ? c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::HashStore>())
                                       : store),
      awaitingMembers_(options.enableReconfigure),
      stableRank_(options.stableRank >= 0 ? options.stableRank : rank),
      instanceId_(randomInstanceId()),
      cpu_(c10::make_intrusive<cpu::CpuBackend>(store_, rank, size, std::move(options.cpu))),
      nccl_(store_, rank, size,
            cuda::NcclSide::Options{cpu_->effectiveTimeout(c10d::kUnsetTimeout), onNcclCreated_, ncclFactory_}) {
#ifndef C10D_BACKEND_HAS_RECONFIGURE
  TORCH_CHECK(!options.enableReconfigure, "tunedist: rank ", rank, ": enable_reconfigure needs a torch whose c10d ",
              "has reconfigure (C10D_BACKEND_HAS_RECONFIGURE: torch 2.14 or later)");
#endif
  cpu_->setFailureCallback([hooks = abortHooks_, rank, membership = abortHooks_->membership()] {
    hooks->runForFailure(rank, membership);
  });
}

TunedBackend::~TunedBackend() { shutdown(); }

c10d::Backend& TunedBackend::cudaSide(const char* op, const cuda::DeviceScan& scan, bool failGroup) {
  c10d::Backend* nccl = nullptr;
  bool startCoalescing = false;
  try {
    TORCH_CHECK(!scan.cpu,
                "mixes CPU and CUDA tensors; one call runs on one device type, so move all its tensors "
                "to the same device");
    nccl = &nccl_.get(getBoundDeviceId(), getGroupDesc());
    {
      std::lock_guard<std::mutex> lock(mutex_);
      startCoalescing = coalescing_ && !ncclCoalescing_;
      ncclCoalescing_ = ncclCoalescing_ || coalescing_;
    }
  } catch (const c10::Error& e) {
    if (failGroup) {
      cpu_->rejectCall(op, e.what_without_backtrace());
    }
    TORCH_CHECK(false, "tunedist: ", op, ": rank ", rank_, " of ", size_, ": ", e.what_without_backtrace());
  }
  if (startCoalescing) {
    nccl->startCoalescing();
  }
  return *nccl;
}

c10::intrusive_ptr<c10d::Work> TunedBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  return collective("broadcast", tensors).broadcast(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> TunedBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  return collective("all_reduce", tensors).allreduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> TunedBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  return collective("all_reduce", tensors).allreduce_sparse(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> TunedBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                 const c10d::AllreduceCoalescedOptions& opts) {
  return collective("all_reduce_coalesced", tensors).allreduce_coalesced(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> TunedBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  return collective("reduce", tensors).reduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> TunedBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllgatherOptions& opts) {
  return collective("all_gather", outputs, inputs).allgather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> TunedBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions& opts) {
  return collective("all_gather_into_tensor", output, input)._allgather_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> TunedBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) {
  return collective("all_gather_coalesced", outputLists, inputs).allgather_coalesced(outputLists, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> TunedBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const c10d::AllgatherOptions& opts) {
  return collective("all_gather_into_tensor_coalesced", outputs, inputs)
      .allgather_into_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> TunedBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  return collective("gather", outputs, inputs).gather(outputs, inputs, opts);
}

#ifdef TUNEDIST_C10D_HAS_GATHER_SINGLE
c10::intrusive_ptr<c10d::Work> TunedBackend::gather_single(at::Tensor& output, at::Tensor& input,
                                                           const c10d::GatherOptions& opts) {
  c10d::Backend& side = collective("gather_single", output, input);
  return &side == cpu_.get() ? cpu_->gatherSingle(output, input, opts) : side.gather_single(output, input, opts);
}
#elif defined(TUNEDIST_C10D_HAS_GATHER_INTO_TENSOR)
c10::intrusive_ptr<c10d::Work> TunedBackend::gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                                                const c10d::GatherOptions& opts) {
  c10d::Backend& side = collective("gather_single", output, input);
  return &side == cpu_.get() ? cpu_->gatherSingle(output, input, opts) : side.gather_into_tensor(output, input, opts);
}
#endif

c10::intrusive_ptr<c10d::Work> TunedBackend::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ScatterOptions& opts) {
  return collective("scatter", outputs, inputs).scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> TunedBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ReduceScatterOptions& opts) {
  return collective("reduce_scatter", outputs, inputs).reduce_scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> TunedBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts) {
  return collective("reduce_scatter_tensor", output, input)._reduce_scatter_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> TunedBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const c10d::ReduceScatterOptions& opts) {
  return collective("reduce_scatter_tensor_coalesced", outputs, inputs)
      .reduce_scatter_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> TunedBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& outputSplitSizes,
                                                           std::vector<int64_t>& inputSplitSizes,
                                                           const c10d::AllToAllOptions& opts) {
  return collective("all_to_all_single", output, input)
      .alltoall_base(output, input, outputSplitSizes, inputSplitSizes, opts);
}

c10::intrusive_ptr<c10d::Work> TunedBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                      const c10d::AllToAllOptions& opts) {
  return collective("all_to_all", outputs, inputs).alltoall(outputs, inputs, opts);
}

// A barrier names its device instead of passing tensors (BarrierOptions::device). torch's c10d::barrier op rebuilds
// the options from device_ids alone, dropping the device that dist.barrier() set; device ids name CUDA devices (as
// ProcessGroupNCCL reads them), so a barrier with device_ids goes to the NCCL side, as it would on torch's "nccl".
// Where no CUDA device is usable (device_ids passed on a CPU machine) it stays a CPU barrier.
c10::intrusive_ptr<c10d::Work> TunedBackend::barrier(const c10d::BarrierOptions& opts) {
  static const bool ncclCompiledIn = cuda::ncclBuildInfo().compiledIn;
  std::optional<at::Device> device = opts.device;
  if (!device.has_value() && !opts.device_ids.empty() && ncclCompiledIn && at::hasCUDA()) {
    device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(opts.device_ids.front()));
  }
  return collective("barrier", device).barrier(opts);
}

c10::intrusive_ptr<c10d::Work> TunedBackend::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  return route("send", false, tensors).send(tensors, dstRank, tag);
}

c10::intrusive_ptr<c10d::Work> TunedBackend::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  return route("recv", false, tensors).recv(tensors, srcRank, tag);
}

c10::intrusive_ptr<c10d::Work> TunedBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return route("recv", false, tensors).recvAnysource(tensors, tag);
}

void TunedBackend::startCoalescing() {
  cpu_->startCoalescing();
  std::lock_guard<std::mutex> lock(mutex_);
  coalescing_ = true;
}

c10::intrusive_ptr<c10d::Work> TunedBackend::endCoalescing() {
  bool nccl = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    coalescing_ = false;
    nccl = std::exchange(ncclCoalescing_, false);
  }
  if (!nccl) {
    return cpu_->endCoalescing();
  }
  // The block's CUDA calls went to ProcessGroupNCCL, which returns the Work of the whole block.
  const size_t cpuWorks = cpu_->coalescedCount();
  cpu_->endCoalescing();
  auto work = nccl_.existing()->endCoalescing();
  TORCH_CHECK(cpuWorks == 0, "tunedist: endCoalescing on rank ", rank_, ": the coalesced block mixed CPU and CUDA ",
              "operations; coalesce the operations of one device type at a time");
  return work;
}

c10::intrusive_ptr<c10d::Backend::Options> TunedBackend::getBackendOptions() {
  auto opts = c10::make_intrusive<c10d::Backend::Options>(getBackendName(),
                                                          cpu_->effectiveTimeout(c10d::kUnsetTimeout));
  opts->group_name = getGroupUid();
  return opts;
}

c10::intrusive_ptr<c10d::Backend> TunedBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                      const std::vector<int>& ranks,
                                                      const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  // `ranks` are ranks of this group; a rank outside them gets no backend (torch makes it a non-member).
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) {
    return nullptr;
  }
  for (int r : ranks) {
    TORCH_CHECK(r >= 0 && r < size_, "tunedist: split on rank ", rank_, ": rank ", r, " is not in the parent group of ",
                size_, " ranks");
  }
  requireMembers("split");
  TORCH_CHECK(!cpu_->isShutDown(), "tunedist: split on rank ", rank_,
              ": the parent process group was shut down or aborted");
  Options child{cpu_->options(), onNcclCreated_, ncclFactory_};
  child.stableRank = stableRank_;
  if (opts && opts->timeout.count() > 0) {
    child.cpu.timeout = opts->timeout;
  }
  return c10::make_intrusive<TunedBackend>(store, int(it - ranks.begin()), int(ranks.size()), std::move(child));
}

void TunedBackend::setTimeout(std::chrono::milliseconds timeout) {
  cpu_->setTimeout(timeout);
  nccl_.setTimeout(timeout);
}

void TunedBackend::setGroupUid(const std::string& pgUid) {
  c10d::Backend::setGroupUid(pgUid);
  cpu_->setGroupUid(pgUid);
  nccl_.setGroupUid(pgUid);
}

void TunedBackend::abort() {
  abortHooks_->runForAbort(rank_);
  cpu_->abort();
  nccl_.abort();
  shutdown();
}

void TunedBackend::shutdown() {
  nccl_.shutdown();
  cpu_->shutdown();
}

}  // namespace tunedist
