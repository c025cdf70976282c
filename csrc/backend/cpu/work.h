// TunedWork: the c10d::Work of every tunedist operation. It completes on the backend's worker thread (or inline,
// for a small synchronous call), carries its op type, per-group sequence number and a profiler title, and its
// future yields the output tensors (the DDP contract: a TensorList). The future is made on the first getFuture():
// a synchronous dist.all_reduce never asks for one, and making and settling it (a List of the outputs, the future's
// lock and condition variable) was a third of the Work's cost per call.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <vector>

namespace tunedist::cpu {

// An operation's failure as its Work (and torch.ops.tunedist.all_reduce_) hands it to users: engine failures
// (tunedist::core::Error and its TimeoutError/PeerDeadError) become c10::DistBackendError, which Python raises as
// torch.distributed.DistBackendError (a RuntimeError), as it does for gloo's and NCCL's failures; the message keeps
// the op, sequence number, ranks and cause. Errors that are already c10 errors stay as they are.
std::exception_ptr asDistBackendError(std::exception_ptr error);

// Whether the calling thread has profiler callbacks: a Work then carries the profiler's event (tuned:all_reduce).
bool profilerCallbacksActive();

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
  bool finished() const { return state_.load(std::memory_order_acquire) != kPending; }
  // Set by the backend before the Work is handed out: wait() first lets the caller's thread run queued operations
  // up to this one (TunedBackend::helpUntil). Holds the backend weakly.
  void setHelper(std::function<void(const TunedWork&)> helper) { helper_ = std::move(helper); }

 private:
  TunedWork(int rank, c10d::OpType opType, const char* profilingTitle, uint64_t seq, std::vector<at::Tensor> outputs,
            c10::ArrayRef<at::Tensor> inputs, std::chrono::milliseconds timeout, bool profiled);

  enum State : int { kPending, kSucceeded, kFailed };
  // Settles the future, if one was made, and sets the state: exactly one of complete() and getFuture() marks it.
  void settle(State state, std::exception_ptr error);

  const uint64_t seq_;
  std::atomic<int> sourceRank_{-1};
  std::vector<at::Tensor> outputs_;
  const std::chrono::milliseconds timeout_;
  std::atomic<int> state_{kPending};  // set once, after the future is marked and before finish() releases wait()
  mutable std::mutex futureMutex_;    // guards the three below
  State settled_ = kPending;          // what settle() was given; getFuture() marks a future made after it
  std::exception_ptr error_;          // read without the lock once state_ is kFailed
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::function<void(const TunedWork&)> helper_;
};

}  // namespace tunedist::cpu
