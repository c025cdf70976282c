// powerSGD_hook: layer-wise PowerSGD with torch's semantics (powerSGD_hook.py), in C++ for the whole bucket.
//
// Before start_powerSGD_iter: allreduce_hook (state.cpp: startPowerSgd). Afterwards, per bucket:
//  1. error feedback: bucket += error (ErrorFeedback, error_feedback.cpp; a compressed matrix on our kernels gets it
//     in step 5's pass);
//  2. classify each gradient, viewed as (n, m = numel / n): compressed iff (n + m) r * min_rate < n m
//     (r = min(n, m, rank); shouldCompress); the others (all vectors) go, concatenated, into one uncompressed buffer;
//  3. group compressed matrices by shape (first-seen order), optionally one batch per shape; P (B, n, r) and
//     Q (B, m, r) are views into one P memory and one Q memory. CPU float32 batches run our low-rank kernels
//     matrix by matrix (low_rank.cpp: nothing stacked); others are stacked and run ATen's bmm as torch's hook;
//  4. Q: warm start orthogonalises last step's Q, otherwise a seeded standard normal (state.cpp: prepareMemories,
//     fillQsWithNormal), orthogonalised (orthogonalize.cpp);
//  5. P = M Q; allreduce the uncompressed buffer and the P memory (issued together, on this thread, so every
//     rank issues collectives in the same order); wait for P;
//  6. orthogonalise P; Q = M^T P; allreduce the Q memory;
//  7. when both are done: uncompressed /= size and copied back; Q /= size; M = P Q^T written into the gradients
//     (unstacked if batched); error = error-fed input - result, region by region as each region is overwritten
//     (ErrorFeedback; our kernels compute, write and update the error in one pass); without warm start the
//     memories are dropped.
// The algorithm is torch's step for step. Our kernels round differently from BLAS (FMA, summation order), so
// parameters match torch's to float tolerance; the ATen path (other devices and dtypes) matches bit for bit.
#include <ATen/core/jit_type.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>

#include "hooks/powersgd/error_feedback.h"
#include "hooks/powersgd/low_rank.h"
#include "hooks/powersgd/state.h"

namespace tunedist::hooks {
namespace {

constexpr const char* kOp = "tunedist.hooks.powerSGD_hook";

struct Batch {
  std::vector<at::Tensor> matrices;  // the B gradients, each viewed (n, m)
  at::Tensor p;                      // (B, n, r)
  at::Tensor q;                      // (B, m, r)
  bool native = false;               // our kernels, matrix by matrix
  at::Tensor stacked;                // ATen path: (B, n, m), stacked copies if B > 1, else matrices[0] unsqueezed
};

struct Plan {
  std::vector<at::Tensor> uncompressed;
  // Compressed 2-D matrices grouped by shape, shapes in first-seen order.
  std::vector<std::vector<at::Tensor>> groups;
  int64_t totalPs = 0;
  int64_t totalQs = 0;
};

}  // namespace

bool shouldCompress(int64_t n, int64_t m, int64_t rank, double minCompressionRate) {
  return static_cast<double>((n + m) * rank) * minCompressionRate < static_cast<double>(n * m);
}

namespace {

int64_t rankFor(const PowerSgdState& state, int64_t n, int64_t m) {
  return std::min({n, m, state.options.matrixApproximationRank});
}

// Step 2 (+ statistics). 0-d and empty gradients are left uncompressed (torch's hook cannot view them).
Plan planCompression(PowerSgdState& state, const std::vector<at::Tensor>& grads) {
  Plan plan;
  std::map<std::vector<int64_t>, size_t> groupOf;
  for (const auto& t : grads) {
    const int64_t n = t.dim() == 0 ? 1 : t.size(0);
    const int64_t m = n == 0 ? 0 : t.numel() / n;
    const int64_t r = rankFor(state, n, m);
    state.totalNumelBeforeCompression += n * m;
    if (t.numel() == 0 || !shouldCompress(n, m, r, state.options.minCompressionRate)) {
      plan.uncompressed.push_back(t);
      state.totalNumelAfterCompression += n * m;
      continue;
    }
    state.totalNumelAfterCompression += (n + m) * r;
    plan.totalPs += n * r;
    plan.totalQs += m * r;
    at::Tensor matrix = t.view({n, m});
    auto [it, fresh] = groupOf.emplace(std::vector<int64_t>{n, m}, plan.groups.size());
    if (fresh) plan.groups.emplace_back();
    plan.groups[it->second].push_back(matrix);
  }
  return plan;
}

at::Tensor packUncompressed(PowerSgdWorkspace& ws, const std::vector<at::Tensor>& tensors, const ErrorFeedback& error,
                            const at::TensorOptions& options) {
  int64_t total = 0;
  for (const auto& t : tensors) total += t.numel();
  at::Tensor memory = reuse(ws.uncompressed, {total}, options);
  int64_t offset = 0;
  for (const auto& t : tensors) {
    error.applyPending(t);
    memory.narrow(0, offset, t.numel()).copy_(t.reshape({-1}));
    offset += t.numel();
  }
  return memory;
}

// Step 3: batches with their P/Q views, in torch's order. The error of a native batch's matrices is added with
// P = M Q (computeP); an ATen-path batch's was added to the whole bucket up front (ErrorFeedback).
std::vector<Batch> makeBatches(PowerSgdState& state, PowerSgdWorkspace& ws, Plan& plan, const ErrorFeedback& error,
                               const at::Tensor& pMemory, const at::Tensor& qMemory) {
  std::vector<Batch> batches;
  const auto add = [&batches](std::vector<at::Tensor> matrices) {
    batches.emplace_back();
    batches.back().matrices = std::move(matrices);
  };
  for (auto& group : plan.groups) {
    if (state.options.batchTensorsWithSameShape && group.size() > 1) {
      add(group);
    } else {
      for (auto& t : group) add({t});
    }
  }
  int64_t pOffset = 0;
  int64_t qOffset = 0;
  size_t stackSlot = 0;
  for (auto& batch : batches) {
    const auto b = static_cast<int64_t>(batch.matrices.size());
    const int64_t n = batch.matrices[0].size(0), m = batch.matrices[0].size(1);
    const int64_t r = rankFor(state, n, m);
    batch.p = pMemory.narrow(0, pOffset, b * n * r).view({b, n, r});
    batch.q = qMemory.narrow(0, qOffset, b * m * r).view({b, m, r});
    pOffset += b * n * r;
    qOffset += b * m * r;
    batch.native = std::all_of(batch.matrices.begin(), batch.matrices.end(),
                               [&](const at::Tensor& t) { return lowRankNative(t, batch.p, batch.q); });
    if (batch.native) continue;
    // Per-region error feedback means a contiguous CPU float32 bucket, whose matrices are native unless the
    // memories are not CPU float32 (loaded from elsewhere); the ATen path below keeps no per-region error.
    TORCH_CHECK(!error.perRegion(), kOp, ": the P/Q memories (", batch.p.scalar_type(), " on ", batch.p.device(),
                ") do not match the bucket's CPU float32 gradients; restore the state into the same model "
                "configuration");
    if (b == 1) {
      batch.stacked = batch.matrices[0].unsqueeze(0);
      continue;
    }
    if (ws.stacked.size() <= stackSlot) ws.stacked.resize(stackSlot + 1);
    batch.stacked = reuse(ws.stacked[stackSlot++], {b, n, m}, batch.matrices[0].options());
    at::stack_out(batch.stacked, batch.matrices);
  }
  return batches;
}

// P = M Q (step 5; a native batch's matrices get their error in the same pass) and Q = M^T P (step 6).
void computeP(Batch& batch, const ErrorFeedback& error) {
  if (!batch.native) {
    at::bmm_out(batch.p, batch.stacked, batch.q);
    return;
  }
  for (size_t i = 0; i < batch.matrices.size(); ++i) {
    const auto k = static_cast<int64_t>(i);
    at::Tensor p = batch.p.select(0, k);
    at::Tensor pending = error.pendingSlice(batch.matrices[i]);
    if (pending.defined()) {
      addErrorAndMultiplyMQ(batch.matrices[i], pending, batch.q.select(0, k), p);
    } else {
      multiplyMQ(batch.matrices[i], batch.q.select(0, k), p);
    }
  }
}

void computeQ(Batch& batch) {
  if (!batch.native) {
    at::bmm_out(batch.q, batch.stacked.transpose(1, 2), batch.p);
    return;
  }
  for (size_t i = 0; i < batch.matrices.size(); ++i) {
    at::Tensor q = batch.q.select(0, static_cast<int64_t>(i));
    multiplyMtP(batch.matrices[i], batch.p.select(0, static_cast<int64_t>(i)), q);
  }
}

void initQs(PowerSgdState& state, std::vector<Batch>& batches, bool randomize) {
  std::vector<at::Tensor> qs;
  for (auto& batch : batches) qs.push_back(batch.q);
  if (randomize) fillQsWithNormal(state, qs);
  for (auto& q : qs) orthogonalize(q, state.options.orthogonalizationEpsilon);
}

// The per-step tensors the decompression (step 7) needs once the allreduces are done.
struct Step {
  at::Tensor input;
  at::Tensor uncompressedMemory;
  std::vector<at::Tensor> uncompressed;
  std::vector<Batch> batches;  // P and Q are views of the P and Q memories
  at::Tensor qMemory;
  ErrorFeedback error;
  bool isLast;
};

// M = P Q^T for one batch into its gradients; a native batch's error is updated as each gradient is overwritten
// (ErrorFeedback per region; the ATen path has none: ErrorFeedback::finish does it for the whole bucket).
void writeBatch(Batch& batch, const ErrorFeedback& error) {
  if (batch.native) {
    for (size_t i = 0; i < batch.matrices.size(); ++i) {
      const auto k = static_cast<int64_t>(i);
      writePQt(batch.matrices[i], batch.p.select(0, k), batch.q.select(0, k), error.sliceFor(batch.matrices[i]));
    }
    return;
  }
  at::bmm_out(batch.stacked, batch.p, batch.q.transpose(1, 2));  // B == 1: the gradient itself
  if (batch.matrices.size() > 1) {
    for (size_t i = 0; i < batch.matrices.size(); ++i) batch.matrices[i].copy_(batch.stacked[int64_t(i)]);
  }
}

// Step 7 (called when the uncompressed and Q allreduces are done).
at::Tensor decompress(PowerSgdState& state, Step& step, int worldSize) {
  step.uncompressedMemory.div_(worldSize);
  int64_t offset = 0;
  for (auto& t : step.uncompressed) {
    step.error.replace(t, step.uncompressedMemory.narrow(0, offset, t.numel()));
    offset += t.numel();
  }
  step.qMemory.div_(worldSize);
  for (auto& batch : step.batches) writeBatch(batch, step.error);
  step.error.finish();
  std::lock_guard<std::mutex> guard(state.mutex);
  endPowerSgdStep(state, step.isLast);
  return step.input;
}

// A future completed with fn() once both `a` and `b` are done, or with the first error (no thread blocks).
FuturePtr whenBoth(const FuturePtr& a, const FuturePtr& b, std::function<at::Tensor()> fn) {
  auto result = c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get());
  auto remaining = std::make_shared<std::atomic<int>>(2);
  auto onDone = [a, b, result, remaining, fn = std::move(fn)](c10::ivalue::Future&) {
    if (remaining->fetch_sub(1) != 1) return;
    try {
      a->value();  // rethrows a failed allreduce
      b->value();
      result->markCompleted(c10::IValue(fn()));
    } catch (...) {
      result->setError(std::current_exception());
    }
  };
  a->addCallback(onDone);
  b->addCallback(onDone);
  return result;
}

class PowerSgdCommHook : public TensorResultHook {
 public:
  PowerSgdCommHook(GroupPtr group, std::shared_ptr<PowerSgdState> state, bool batched)
      : group_(std::move(group)), state_(std::move(state)), batched_(batched) {}
  FuturePtr runHook(c10d::GradBucket& bucket) override {
    return batched_ ? runBatchedPowerSgd(state_, group_, bucket) : runPowerSgd(state_, group_, bucket);
  }

 private:
  GroupPtr group_;
  std::shared_ptr<PowerSgdState> state_;
  bool batched_;
};

}  // namespace

FuturePtr runPowerSgd(const std::shared_ptr<PowerSgdState>& statePtr, const GroupPtr& group, c10d::GradBucket& bucket) {
  PowerSgdStart start = startPowerSgd(statePtr, group, bucket, kOp);
  if (start.allreduced) return start.allreduced;
  PowerSgdState& state = *statePtr;
  at::Tensor& input = start.input;
  const int64_t index = start.index;
  const std::vector<at::Tensor> grads = bucket.getGradients();
  ErrorFeedback error(state, index, input, grads, kOp);
  Plan plan = planCompression(state, grads);
  state.reportCompressionStats(bucket);
  PowerSgdWorkspace& ws = state.workspaces[index];
  at::Tensor uncompressedMemory = packUncompressed(ws, plan.uncompressed, error, input.options());
  const bool randomize = prepareMemories(state, index, {plan.totalPs}, {plan.totalQs}, input.options());
  at::Tensor pMemory = state.pMemoryDict[index];
  at::Tensor qMemory = state.qMemoryDict[index];
  TORCH_CHECK(pMemory.numel() == plan.totalPs && qMemory.numel() == plan.totalQs, kOp,
              ": the warm-start memories of bucket ", index,
              " do not fit its gradients (the buckets changed since "
              "they were made or loaded; restore the state into the same model configuration)");
  auto step = std::make_shared<Step>(Step{input, uncompressedMemory, std::move(plan.uncompressed),
                                          makeBatches(state, ws, plan, error, pMemory, qMemory), qMemory,
                                          std::move(error), bucket.isLast()});
  initQs(state, step->batches, randomize);
  start.lock.unlock();

  for (auto& b : step->batches) computeP(b, step->error);
  FuturePtr uncompressedFut = allreduceSum(group, uncompressedMemory);
  allreducePAndWait(group, pMemory, kOp);
  for (auto& b : step->batches) {
    orthogonalize(b.p, state.options.orthogonalizationEpsilon);
    computeQ(b);
  }
  FuturePtr qFut = allreduceSum(group, qMemory);

  const int worldSize = group->getSize();
  return whenBoth(uncompressedFut, qFut,
                  [statePtr, step, worldSize]() { return decompress(*statePtr, *step, worldSize); });
}

std::unique_ptr<c10d::CommHookInterface> makePowerSgdHook(GroupPtr group, std::shared_ptr<PowerSgdState> state,
                                                          bool batched) {
  TORCH_CHECK(group, "tunedist.hooks.register: PowerSGD needs a process group");
  TORCH_CHECK(state, "tunedist.hooks.register: PowerSGD needs a state");
  return std::make_unique<PowerSgdCommHook>(std::move(group), std::move(state), batched);
}

}  // namespace tunedist::hooks
