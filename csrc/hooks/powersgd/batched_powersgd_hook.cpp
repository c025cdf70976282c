// batched_powerSGD_hook: PowerSGD on the whole bucket viewed as one square matrix, torch's algorithm
// (powerSGD_hook.py) with its orthogonalisation given the 3-D (1, s, r) view it expects (torch's own hook passes
// the 2-D matrix and fails on its first compressed step). Steps, after start_powerSGD_iter:
//  1. s = ceil(sqrt(length)); the bucket, zero-padded to s*s, goes into a reused padded buffer (state.cpp: reuse);
//  2. error feedback on the padded buffer (error_feedback.cpp: addErrorFeedback);
//  3. Q (s, r): warm start keeps last step's, otherwise a seeded standard normal (state.cpp: prepareMemories,
//     fillQsWithNormal); orthogonalise Q (orthogonalize.cpp);
//  4. P = M Q; allreduce P (issued and awaited on this thread); orthogonalise P; Q = M^T P; allreduce Q
//     (products: low_rank.cpp);
//  5. when Q is done: Q /= size; M = P Q^T; error = remembered sum - M; the bucket gets M's first `length` values.
// Unlike torch, r is capped at s (torch's assertion fails for rank > s) and orthogonalization_epsilon applies.
#include <ATen/core/jit_type.h>

#include <cmath>

#include "hooks/powersgd/error_feedback.h"
#include "hooks/powersgd/state.h"

namespace tunedist::hooks {
namespace {

constexpr const char* kOp = "tunedist.hooks.batched_powerSGD_hook";

struct Step {
  at::Tensor input;
  at::Tensor padded;
  at::Tensor matrix;
  at::Tensor p;
  at::Tensor q;
};

// Steps 1-3 (caller holds the mutex).
Step prepare(PowerSgdState& state, int64_t index, const at::Tensor& input) {
  const int64_t length = input.numel();
  const auto side = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(length))));
  state.totalNumelBeforeCompression += length;
  state.totalNumelAfterCompression += side * state.options.matrixApproximationRank * 2;
  at::Tensor padded = reuse(state.workspaces[index].padded, {side * side}, input.options());
  Step step{input, padded, padded.view({side, side}), {}, {}};
  step.padded.narrow(0, 0, length).copy_(input);
  step.padded.narrow(0, length, side * side - length).zero_();
  if (state.options.useErrorFeedback) addErrorFeedback(state, index, step.padded, kOp);

  const int64_t rank = std::min(state.options.matrixApproximationRank, side);
  if (prepareMemories(state, index, {side, rank}, {side, rank}, input.options())) {
    std::vector<at::Tensor> qs{state.qMemoryDict[index]};
    fillQsWithNormal(state, qs);
  }
  step.p = state.pMemoryDict[index];
  step.q = state.qMemoryDict[index];
  TORCH_CHECK(step.p.size(0) == side && step.q.size(0) == side, kOp, ": the warm-start memories of bucket ", index,
              " are ", step.p.size(0), " rows but the bucket needs ", side,
              " (the buckets changed since they were made or loaded)");
  at::Tensor q3 = step.q.unsqueeze(0);
  orthogonalize(q3, state.options.orthogonalizationEpsilon);
  return step;
}

at::Tensor finish(PowerSgdState& state, int64_t index, bool isLast, int worldSize, Step& step) {
  step.q.div_(worldSize);
  writePQt(step.matrix, step.p, step.q, {});
  std::lock_guard<std::mutex> guard(state.mutex);
  if (state.options.useErrorFeedback) state.errorDict[index].sub_(step.padded);
  step.input.copy_(step.padded.narrow(0, 0, step.input.numel()));
  endPowerSgdStep(state, isLast);
  return step.input;
}

}  // namespace

FuturePtr runBatchedPowerSgd(const std::shared_ptr<PowerSgdState>& statePtr, const GroupPtr& group,
                             c10d::GradBucket& bucket) {
  PowerSgdStart start = startPowerSgd(statePtr, group, bucket, kOp);
  if (start.allreduced) return start.allreduced;
  if (start.input.numel() == 0) {
    statePtr->maybeIncreaseIter(bucket.isLast());
    return completedFuture(start.input);
  }
  PowerSgdState& state = *statePtr;
  auto step = std::make_shared<Step>(prepare(state, start.index, start.input));
  state.reportCompressionStats(bucket);
  start.lock.unlock();

  multiplyMQ(step->matrix, step->q, step->p);
  allreducePAndWait(group, step->p, kOp);
  at::Tensor p3 = step->p.unsqueeze(0);
  orthogonalize(p3, state.options.orthogonalizationEpsilon);
  multiplyMtP(step->matrix, step->p, step->q);
  const int worldSize = group->getSize();
  return allreduceSum(group, step->q)
      ->then(
          [statePtr, step, index = start.index, isLast = bucket.isLast(), worldSize](c10::ivalue::Future& f) {
            f.value();  // rethrows a failed allreduce
            return c10::IValue(finish(*statePtr, index, isLast, worldSize, *step));
          },
          c10::TensorType::get());
}

}  // namespace tunedist::hooks
