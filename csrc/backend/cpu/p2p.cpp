// send, recv and recvAnysource: the c10d entry points of the point-to-point engine (HostP2p,
// backend/engine/host_p2p.h).
//
// Unlike the collectives these do not go through the executor: the engine's own progress thread moves the bytes,
// and the Work completes from its Done callback. So a blocked receive never holds up the collectives queued behind
// it, and sends and receives to different peers (batch_isend_irecv) run concurrently.
// Sequence numbers: point-to-point operations are not ordered across the group, so they take their own counter
// (p2pSeq_), separate from the collectives' group sequence.
// Caller errors throw without failing the group, unlike the collectives' guardCall: no peer is inside an
// operation with this rank yet, and a bad send must not make the collectives of the whole group unusable.
// Completion hooks: a send or receive that completes is reported as ProcessGroupNCCL's watchdog reports its
// point-to-point Works (OpType SEND, RECV or RECVANYSOURCE with the point-to-point sequence number), started when it
// was issued (the engine starts it at once, no queue in front) and finished when its bytes were out or in. With no
// hook registered that costs one relaxed load per call (CompletionHooks::stamp).
#include <c10/util/Exception.h>

#include "backend/cpu/checks.h"
#include "backend/cpu/completion_hooks.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/engine/host_p2p.h"

namespace tunedist::cpu {
namespace {

constexpr const char* kSend = "send";
constexpr const char* kRecv = "recv";

// Runs `checks`; rethrows a failure with the op, rank and group size in front.
template <typename F>
void checkP2pCall(int rank, int size, const char* op, F&& checks) {
  try {
    checks();
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "tunedist: ", op, ": rank ", rank, " of ", size, ": ", e.what_without_backtrace());
  }
}

void checkTensors(const std::vector<at::Tensor>& tensors) {
  TORCH_CHECK(tensors.size() == 1, "expects exactly one tensor, got ", tensors.size());
  cpu::checkCpuDense(tensors[0], "the tensor");
}

void checkPeer(int peer, int rank, int size, const char* role) {
  TORCH_CHECK(peer >= 0 && peer < size, role, " rank ", peer, " is outside the group of ", size, " ranks");
  // As with gloo: a rank cannot send to or receive from itself.
  TORCH_CHECK(peer != rank, role, " rank ", peer, " is this rank; sending to oneself is not supported");
}

// What the completion hooks get for one point-to-point operation; `issued` is the epoch where no hook was registered
// at issue (report() then does nothing).
struct P2pReport {
  std::shared_ptr<CompletionHooks> hooks;
  CompletionHooks::Clock::time_point issued;

  static P2pReport at(Executor& executor) {
    CompletionHooks& hooks = executor.hooks();
    const auto issued = hooks.stamp();
    return P2pReport{issued == CompletionHooks::Clock::time_point{} ? nullptr : hooks.shared_from_this(), issued};
  }
  void done(const TunedWork& work) const {
    if (issued == CompletionHooks::Clock::time_point{}) {
      return;
    }
#ifdef TUNEDIST_C10D_HAS_COMPLETION_HOOKS
    const uint64_t key = work.getCompletionKey();
#else
    const uint64_t key = uint64_t(reinterpret_cast<uintptr_t>(&work));
#endif
    hooks->report({work.retrieveOpType(), work.getSequencenumber(), issued, issued, CompletionHooks::Clock::now(),
                   key});
  }
};

// Completes `work` from the engine's callback; `finish` (may be empty) runs first on success, e.g. to copy a
// staged receive back into the caller's tensor. `report` tells the completion hooks on success. When the engine
// fails the operation (a dead peer, a timeout), `hooks` (the group's abort hooks, as for a failed collective; may be
// empty) run first, on the engine's thread.
engine::HostP2p::Done completion(c10::intrusive_ptr<TunedWork> work, bool setSource, std::function<void()> finish,
                                 P2pReport report, std::function<void()> hooks) {
  return [work = std::move(work), setSource, finish = std::move(finish), report = std::move(report),
          hooks = std::move(hooks)](std::exception_ptr error, int peer) {
    if (error != nullptr && hooks) {
      hooks();
    }
    if (error == nullptr && finish) {
      try {
        finish();
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (error != nullptr) {
      work->completeWithError(std::move(error));
      return;
    }
    if (setSource) {
      work->setSourceRank(peer);
    }
    report.done(*work);  // before complete(): a caller that waited on the Work finds the hook's record queued
    work->complete();
  };
}

// Hands the operation to the engine. Should that throw (it cannot start its thread, say), the Work fails too, so a
// coalesced group that holds it does not wait for it.
template <typename F>
void post(const c10::intrusive_ptr<TunedWork>& work, F&& start) {
  try {
    start();
  } catch (...) {
    work->completeWithError(std::current_exception());
    throw;
  }
}

// The group's abort hooks for a send or receive that the engine failed (`callback`, may be empty), unless the group
// was shut down (the engine fails what is pending when it closes, perhaps while the caller holds the GIL a Python
// hook would need).
std::function<void()> failureHooks(const std::function<void()>& callback, std::shared_ptr<Executor> executor) {
  if (!callback) {
    return {};
  }
  return [callback, executor = std::move(executor)] {
    if (!executor->stopped()) {
      callback();
    }
  };
}

}  // namespace

// Posts a receive of `t` from srcRank (-1: any source).
c10::intrusive_ptr<c10d::Work> CpuBackend::startRecv(const at::Tensor& t, int srcRank, int tag) {
  // Received into the caller's memory when it is contiguous; otherwise into a contiguous buffer copied back on
  // completion (on the engine's thread, before the Work completes).
  at::Tensor staged = t.is_contiguous() ? t
                                        : at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
  const auto timeout = effectiveTimeout(c10d::kUnsetTimeout);
  const bool any = srcRank < 0;
  const std::vector<at::Tensor> tensors{t};
  auto work = c10::make_intrusive<TunedWork>(rank_, any ? c10d::OpType::RECVANYSOURCE : c10d::OpType::RECV,
                                             any ? "tuned:recv_anysource" : "tuned:recv", ++p2pSeq_, tensors, tensors,
                                             timeout);
  executor_->trackWork(work);
  P2pReport report = P2pReport::at(*executor_);
  std::function<void()> copyBack;
  if (!staged.is_same(t)) {
    copyBack = [t, staged]() mutable { t.copy_(staged); };
  } else {
    copyBack = [staged] {};  // keeps the tensor's storage alive until the bytes are in
  }
  engine::HostP2p& engine = p2pEngine();  // may wait for the group's layout, at its first operation
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  engine::HostP2p::Done done = completion(work, true, std::move(copyBack), std::move(report),
                                          failureHooks(failureCallback_, executor_));
  post(work, [&] { engine.irecv(srcRank, tag, staged, deadline, std::move(done)); });
  return work;
}

c10::intrusive_ptr<c10d::Work> CpuBackend::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  checkP2pCall(rank_, size_, kSend, [&] {
    checkTensors(tensors);
    checkPeer(dstRank, rank_, size_, "destination");
  });
  const at::Tensor& t = tensors[0];
  // Sent from the caller's memory when it is contiguous (the caller must leave it alone until the Work
  // completes, as with every backend); otherwise from a contiguous copy made now.
  at::Tensor staged = cpu::staged(t.resolve_conj().resolve_neg());
  const auto timeout = effectiveTimeout(c10d::kUnsetTimeout);
  auto work = c10::make_intrusive<TunedWork>(rank_, c10d::OpType::SEND, "tuned:send", ++p2pSeq_,
                                             std::vector<at::Tensor>{t}, tensors, timeout);
  executor_->trackWork(work);
  P2pReport report = P2pReport::at(*executor_);
  // The callback holds `staged`, so a copy lives until its bytes are out.
  engine::HostP2p& engine = p2pEngine();  // may wait for the group's layout, at its first operation
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::function<void()> keepStaged = [staged] {};
  engine::HostP2p::Done done = completion(work, false, std::move(keepStaged), std::move(report),
                                          failureHooks(failureCallback_, executor_));
  post(work, [&] { engine.isend(dstRank, tag, staged, deadline, std::move(done)); });
  return work;
}

c10::intrusive_ptr<c10d::Work> CpuBackend::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  checkP2pCall(rank_, size_, kRecv, [&] {
    checkTensors(tensors);
    checkPeer(srcRank, rank_, size_, "source");
  });
  return startRecv(tensors[0], srcRank, tag);
}

c10::intrusive_ptr<c10d::Work> CpuBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  checkP2pCall(rank_, size_, "recv (any source)", [&] { checkTensors(tensors); });
  return startRecv(tensors[0], -1, tag);
}

}  // namespace tunedist::cpu
