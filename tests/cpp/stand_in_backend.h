// A stand-in for the backend torch makes for "nccl", for tests of what a `tuned` group forwards to its NCCL side on
// a machine without a GPU: it records every c10d call that reaches it, by name, and answers the capability queries
// as torch 2.15's nccl2 does (capable) or as a backend without the optional features does. CUDA tensors made by
// deviceOnlyCudaTensor claim cuda:0 but have no memory behind them: the group routes by device, and the stand-in
// never reads data.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

namespace tunedist_test {

inline at::Tensor deviceOnlyCudaTensor(int64_t numel) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), size_t(numel) * sizeof(float),
                       c10::DataPtr(nullptr, c10::Device(c10::kCUDA, 0)), /*allocator=*/nullptr,
                       /*resizable=*/false);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CUDA),
                                                    caffe2::TypeMeta::Make<float>());
  t.unsafeGetTensorImpl()->set_sizes_contiguous({numel});
  return t;
}

class DoneWork : public c10d::Work {
 public:
  explicit DoneWork(c10d::OpType type) : c10d::Work(0, type) {}
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
};

// The stand-in: every c10d call the facade may forward, recorded by name. `capable` switches the optional features
// (hooks, shrink, windows, reconfigure, tensor allocation) on, as torch 2.15's nccl2 has them, or off, as the
// classic ProcessGroupNCCL lacks most.
class StandIn : public c10d::Backend {
 public:
  StandIn(int rank, int size, bool capable) : c10d::Backend(rank, size), capable_(capable) {}
  const std::string getBackendName() const override { return "stand-in"; }

  std::vector<std::string> calls() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls_;
  }
  bool called(const std::string& name) const {
    auto c = calls();
    return std::find(c.begin(), c.end(), name) != c.end();
  }
  std::map<int64_t, c10d::AbortHook> abortHooks;
  std::map<int64_t, c10d::CompletionHook> completionHooks;
  std::chrono::milliseconds timeout{0};
  std::chrono::milliseconds ephemeral{0};
  c10d::ErrorType error = c10d::ErrorType::SUCCESS;

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>&, const c10d::AllreduceOptions&) override {
    return done("allreduce", c10d::OpType::ALLREDUCE);
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor&, at::Tensor&, const c10d::AllgatherOptions&) override {
    return done("_allgather_base", c10d::OpType::_ALLGATHER_BASE);
  }
#ifdef TUNEDIST_C10D_HAS_GATHER_SINGLE
  c10::intrusive_ptr<c10d::Work> gather_single(at::Tensor&, at::Tensor&, const c10d::GatherOptions&) override {
    return done("gather_single", c10d::OpType::GATHER);
  }
#endif
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor&, at::Tensor&, std::vector<int64_t>&, std::vector<int64_t>&,
                                               const c10d::AllToAllOptions&) override {
    return done("alltoall_base", c10d::OpType::ALLTOALL_BASE);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return done("barrier", c10d::OpType::BARRIER);
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>&, int, int) override {
    return done("send", c10d::OpType::SEND);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>&, int, int) override {
    return done("recv", c10d::OpType::RECV);
  }
  void startCoalescing() override { note("startCoalescing"); }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override { return done("endCoalescing", c10d::OpType::COALESCED); }

  bool supportsShrinking() const override { return capable_; }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& excluded, int,
                                           const c10::intrusive_ptr<c10d::Backend::Options>&) override {
    note("shrink");
    return c10::make_intrusive<StandIn>(0, size_ - int(excluded.size()), capable_);
  }
  bool supportsWindow() const override { return capable_; }
  c10::intrusive_ptr<c10d::Window> new_window(const std::optional<at::Tensor>&) override {
    note("new_window");
    return c10::make_intrusive<c10d::Window>();
  }
  bool supportsReconfigure() const override { return capable_; }
#ifdef C10D_BACKEND_HAS_RECONFIGURE
  c10d::ReconfigureHandle get_reconfigure_handle() const override { return "stand-in:" + std::to_string(rank_); }
  c10::intrusive_ptr<c10d::Work> reconfigure(const c10d::ReconfigureOptions& opts) override {
    TORCH_CHECK(capable_, "stand-in: reconfigure is off");
    {
      std::lock_guard<std::mutex> lock(mutex_);
      reconfiguredWith = std::get<std::vector<c10d::ReconfigureHandle>>(opts.handles);  // the facade passes a list
    }
    return done("reconfigure", c10d::OpType::UNKNOWN);
  }
  std::vector<c10d::ReconfigureHandle> reconfiguredWith;
#endif
  bool supportsAbortHooks() const override { return capable_; }
  void registerAbortHook(int64_t id, c10d::AbortHook hook) override {
    std::lock_guard<std::mutex> lock(mutex_);
    abortHooks[id] = std::move(hook);
  }
  void unregisterAbortHook(int64_t id) override {
    std::lock_guard<std::mutex> lock(mutex_);
    abortHooks.erase(id);
  }
  bool supportsCompletionHooks() const override { return capable_; }
  void registerCompletionHook(int64_t id, c10d::CompletionHook hook) override {
    std::lock_guard<std::mutex> lock(mutex_);
    completionHooks[id] = std::move(hook);
  }
  void unregisterCompletionHook(int64_t id) override {
    std::lock_guard<std::mutex> lock(mutex_);
    completionHooks.erase(id);
  }
  void registerOnCompletionHook(std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) override {
    TORCH_CHECK(capable_, "Only ProcessGrouppNCCL supports onCompletion hook");
    onCompletionHook_ = std::move(hook);
    note("registerOnCompletionHook");
  }
  void waitForPendingWorks() override { note("waitForPendingWorks"); }
  void enableCollectivesTiming() override { note("enableCollectivesTiming"); }
  void setTimeout(std::chrono::milliseconds t) override { timeout = t; }
  void addEphemeralTimeout(const std::chrono::milliseconds& t) override { ephemeral += t; }
  c10d::ErrorType getError() override { return error; }
  void eagerConnectSingleDevice(at::Device) override { note("eagerConnectSingleDevice"); }
  bool supportsTimeEstimation() const override { return capable_; }
  void startTimeEstimate() override { note("startTimeEstimate"); }
  float endTimeEstimate() override {
    note("endTimeEstimate");
    return 42.0f;
  }
  std::shared_ptr<c10::Allocator> getMemAllocator() override {
    note("getMemAllocator");
    return nullptr;
  }
  bool supportsTensorAlloc(c10::DeviceIndex) override { return capable_; }
  at::Tensor allocateTensor(long size, at::TensorOptions) override {
    note("allocateTensor");
    return at::empty({size});
  }
  void suspend() override { note("suspend"); }
  void resume() override { note("resume"); }
  std::unordered_map<std::string, uint64_t> getMemoryStats() override { return {{"bytes", 7}}; }
  void abort() override {
    note("abort");
    for (auto& [id, hook] : abortHooks) {
      hook();
    }
  }
  void shutdown() override { note("shutdown"); }

 private:
  void note(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    calls_.push_back(name);
  }
  c10::intrusive_ptr<c10d::Work> done(const std::string& name, c10d::OpType type) {
    note(name);
    return c10::make_intrusive<DoneWork>(type);
  }

  const bool capable_;
  mutable std::mutex mutex_;
  std::vector<std::string> calls_;
};

}  // namespace tunedist_test
