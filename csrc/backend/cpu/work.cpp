#include "backend/cpu/work.h"

#include <ATen/core/jit_type.h>
#include <ATen/record_function.h>

#include <sched.h>

#include "core/sync.h"

namespace tunedist::cpu {

// c10d::Work's constructor allocates a RecordFunction whenever it is given a title, profiling or not, and reads the
// inputs only for the profiler's shapes: a Work hands both over only while this thread has profiler callbacks.
bool profilerCallbacksActive() { return at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE).has_value(); }

TunedWork::TunedWork(int rank, c10d::OpType opType, const char* profilingTitle, uint64_t seq,
                     std::vector<at::Tensor> outputs, c10::ArrayRef<at::Tensor> inputs,
                     std::chrono::milliseconds timeout)
    : TunedWork(rank, opType, profilingTitle, seq, std::move(outputs), inputs, timeout, profilerCallbacksActive()) {}

TunedWork::TunedWork(int rank, c10d::OpType opType, const char* profilingTitle, uint64_t seq,
                     std::vector<at::Tensor> outputs, c10::ArrayRef<at::Tensor> inputs,
                     std::chrono::milliseconds timeout, bool profiled)
    : c10d::Work(rank, opType, profiled ? profilingTitle : nullptr,
                 profiled ? std::optional<std::vector<at::Tensor>>(inputs.vec()) : std::nullopt),
      seq_(seq),
      outputs_(std::move(outputs)),
      timeout_(timeout) {}

// state_ is set after the future is marked: a caller woken by the future may look before state_ is set, and then
// the future answers.
bool TunedWork::isCompleted() {
  if (finished()) {
    return true;
  }
  std::lock_guard<std::mutex> lock(futureMutex_);
  return future_ && future_->completed();
}

bool TunedWork::isSuccess() const {
  const int state = state_.load(std::memory_order_acquire);
  if (state != kPending) {
    return state == kSucceeded;
  }
  std::lock_guard<std::mutex> lock(futureMutex_);
  return future_ && future_->completed() && !future_->hasError();
}

bool TunedWork::wait(std::chrono::milliseconds timeout) {
  if (helper_) {
    helper_(*this);
  }
  // Poll briefly first: most operations finish within microseconds, and a sleeping waiter takes 50-200 us to wake
  // on a virtual machine. Past the first few microseconds, yield between polls: with more threads than cores the
  // thread running the operation may need this core.
  const auto start = std::chrono::steady_clock::now();
  const auto spinUntil = start + std::chrono::microseconds(10);
  const auto pollUntil = start + std::chrono::microseconds(200);
  for (auto now = start; !finished() && now < pollUntil; now = std::chrono::steady_clock::now()) {
    if (now < spinUntil) {
      core::cpuRelax();
    } else {
      sched_yield();
    }
  }
  // Settled (the common case: a synchronous call ran inline): no lock.
  switch (state_.load(std::memory_order_acquire)) {
    case kSucceeded: return true;
    case kFailed: std::rethrow_exception(error_);
    default: break;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  auto limit = timeout == kNoTimeout ? timeout_ : timeout;
  bool done = cv_.wait_for(lock, limit, [this] { return completed_; });
  TORCH_CHECK(done, "tunedist: ", c10d::opTypeToString(opType_), " (seq ", seq_, ") on rank ", rank_,
              ": Timed out in wait() after ", limit.count(), " ms; the operation is still running");
  if (exception_) {
    std::rethrow_exception(exception_);
  }
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> TunedWork::getFuture() {
  std::lock_guard<std::mutex> lock(futureMutex_);
  if (!future_) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
    // Made after settle() took its snapshot: settle() will not mark it, so this does (no callbacks exist yet).
    if (settled_ == kSucceeded) {
      future_->markCompleted(c10::IValue(outputs_));
    } else if (settled_ == kFailed) {
      future_->setError(error_);
    }
  }
  return future_;
}

std::vector<at::Tensor> TunedWork::result() { return outputs_; }

uint64_t TunedWork::getSequencenumber() const { return seq_; }

// The order: the future (if one was made) is marked before state_ says the Work is done, so a caller that sees
// isCompleted() finds its future completed too; and state_ before finish() releases a wait() on the Work's lock.
void TunedWork::settle(State state, std::exception_ptr error) {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(futureMutex_);
    settled_ = state;
    error_ = error;
    future = future_;
  }
  if (future) {
    if (state == kFailed) {
      future->setError(error);
    } else {
      future->markCompleted(c10::IValue(outputs_));
    }
  }
  state_.store(state, std::memory_order_release);
}

void TunedWork::complete() {
  settle(kSucceeded, nullptr);
  finish();
}

std::exception_ptr asDistBackendError(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error&) {
    return error;
  } catch (const std::exception& e) {
    return std::make_exception_ptr(c10::DistBackendError(c10::SourceLocation{__func__, __FILE__, __LINE__}, e.what()));
  } catch (...) {
    return error;
  }
}

void TunedWork::completeWithError(std::exception_ptr error) {
  error = asDistBackendError(std::move(error));
  settle(kFailed, error);
  finish(error);
}

}  // namespace tunedist::cpu
