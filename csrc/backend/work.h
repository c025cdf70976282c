// TunedWork: the c10d::Work of every tunedist operation. It completes on the backend's worker thread (or inline,
// for a small synchronous call), carries its op type, per-group sequence number and a profiler title, and its
// future yields the output tensors (the DDP contract: a TensorList).
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <vector>

namespace tunedist {

class TunedWork : public c10d::Work {
 public:
  // `profilingTitle` and `inputs` reach the profiler only while this thread has profiler callbacks (see work.cpp).
  TunedWork(int rank, c10d::OpType opType, const char* profilingTitle, uint64_t seq, std::vector<at::Tensor> outputs,
            c10::ArrayRef<at::Tensor> inputs, std::chrono::milliseconds timeout);

  bool isCompleted() override;
  bool isSuccess() const override;
  // Waits at most `timeout` (the operation's own timeout when kNoTimeout); rethrows the operation's error.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override;
  uint64_t getSequencenumber() const override;
  // The peer a receive got its message from (recvAnysource); -1 until known.
  int sourceRank() const override { return sourceRank_.load(); }
  void setSourceRank(int rank) { sourceRank_.store(rank); }

  // Called once by the backend when the operation has run.
  void complete();
  void completeWithError(std::exception_ptr error);

  const std::vector<at::Tensor>& outputs() const { return outputs_; }
  bool finished() const { return future_->completed(); }
  // Set by the backend before the Work is handed out: wait() first lets the caller's thread run queued operations
  // up to this one (TunedBackend::helpUntil). Holds the backend weakly.
  void setHelper(std::function<void(const TunedWork&)> helper) { helper_ = std::move(helper); }

 private:
  TunedWork(int rank, c10d::OpType opType, const char* profilingTitle, uint64_t seq, std::vector<at::Tensor> outputs,
            c10::ArrayRef<at::Tensor> inputs, std::chrono::milliseconds timeout, bool profiled);

  const uint64_t seq_;
  std::atomic<int> sourceRank_{-1};
  std::vector<at::Tensor> outputs_;
  const std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::function<void(const TunedWork&)> helper_;
};

}  // namespace tunedist
