// PowerSgdState (tunedist/hooks/powersgd_state.h) and what both PowerSGD hooks share around it (state.h): the
// start of a step, the reused buffers and P/Q memories, Q's seeding, P's allreduce, the end of a step.
#include "tunedist/hooks/powersgd_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include "hooks/powersgd/state.h"

namespace tunedist::hooks {
namespace {

// torch's hook draws each step's Q seed as rng.randint(1_000_000_000).
constexpr int64_t kSeedBound = 1'000'000'000;

int64_t tensorBytes(const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

}  // namespace

PowerSgdState::PowerSgdState(const PowerSgdOptions& opts) : options(opts), rng(opts.randomSeed) {
  TORCH_CHECK_VALUE(!((opts.useErrorFeedback || opts.warmStart) && opts.startPowerSgdIter <= 1),
                    "Expect `start_powerSGD_iter` > 1 if `use_error_feedback` or `warm_start` is enabled, because "
                    "PowerSGD can only be applied after the first two iterations in DDP.");
  TORCH_CHECK_VALUE(opts.matrixApproximationRank >= 1, "PowerSGDState: matrix_approximation_rank must be >= 1, got ",
                    opts.matrixApproximationRank);
  options.compressionStatsLoggingFrequency = std::max<int64_t>(1, opts.compressionStatsLoggingFrequency);
}

std::tuple<double, int64_t, int64_t> PowerSgdState::compressionStats() const {
  const double rate = totalNumelAfterCompression > 0
                          ? static_cast<double>(totalNumelBeforeCompression) / totalNumelAfterCompression
                          : 0.0;
  return {rate, totalNumelBeforeCompression, totalNumelAfterCompression};
}

void PowerSgdState::maybeIncreaseIter(bool isLast) {
  if (isLast) ++iter;
  if (iter == options.startPowerSgdIter) LOG(INFO) << "Start to apply PowerSGD after " << iter << " iterations.";
}

void PowerSgdState::reportCompressionStats(const c10d::GradBucket& bucket) {
  if (!bucket.isLast() || iter < nextStatsReport) return;
  auto [rate, before, after] = compressionStats();
  LOG(INFO) << "Compression stats: iter " << iter << ", total before compression " << before
            << ", total after compression " << after << ", rate " << rate;
  nextStatsReport = iter + options.compressionStatsLoggingFrequency;
}

int64_t PowerSgdState::workspaceBytes() {
  std::lock_guard<std::mutex> guard(mutex);
  int64_t total = 0;
  for (auto& [index, ws] : workspaces) {
    total += tensorBytes(ws.uncompressed) + tensorBytes(ws.padded) + tensorBytes(ws.p) + tensorBytes(ws.q);
    for (auto& t : ws.stacked) total += tensorBytes(t);
  }
  return total;
}

PowerSgdStart startPowerSgd(const std::shared_ptr<PowerSgdState>& state, const GroupPtr& group,
                            c10d::GradBucket& bucket, const char* op) {
  TORCH_CHECK(state, op, ": the state is None; pass a tunedist.hooks.powerSGD.PowerSGDState");
  TORCH_CHECK(group, op, ": no process group");
  PowerSgdStart start{
      std::unique_lock<std::mutex>(state->mutex), {}, bucket.getBufferRef(), static_cast<int64_t>(bucket.getIndex())};
  if (state->iter >= state->options.startPowerSgdIter) return start;
  state->maybeIncreaseIter(bucket.isLast());
  start.lock.unlock();
  start.allreduced = allreduceMean(group, start.input);
  return start;
}

at::Tensor reuse(at::Tensor& slot, at::IntArrayRef sizes, const at::TensorOptions& options) {
  if (!slot.defined() || slot.sizes() != sizes || slot.scalar_type() != options.dtype().toScalarType() ||
      slot.device() != options.device()) {
    slot = at::empty(sizes, options);
  }
  return slot;
}

bool prepareMemories(PowerSgdState& state, int64_t index, at::IntArrayRef pSizes, at::IntArrayRef qSizes,
                     const at::TensorOptions& options) {
  const bool warm = state.options.warmStart;
  if (warm && state.pMemoryDict.count(index)) return false;
  PowerSgdWorkspace& ws = state.workspaces[index];
  state.pMemoryDict[index] = warm ? at::empty(pSizes, options) : reuse(ws.p, pSizes, options);
  state.qMemoryDict[index] = warm ? at::empty(qSizes, options) : reuse(ws.q, qSizes, options);
  return true;
}

void fillQsWithNormal(PowerSgdState& state, std::vector<at::Tensor>& qs) {
  const auto seed = static_cast<uint64_t>(state.rng.randint(kSeedBound));
  at::Generator gen = at::detail::createCPUGenerator(seed);
  for (auto& q : qs) {
    if (q.is_cpu() && q.is_contiguous()) {
      q.normal_(0, 1, gen);  // randn's draw, written in place: the same values without a temporary
      continue;
    }
    at::Tensor drawn = at::randn(q.sizes(), gen, at::TensorOptions().dtype(q.scalar_type()).device(at::kCPU));
    q.copy_(drawn);
  }
}

void allreducePAndWait(const GroupPtr& group, const at::Tensor& p, const char* op) {
  FuturePtr fut = allreduceSum(group, p);
  fut->wait();
  TORCH_CHECK(!fut->hasError(), op, ": rank ", groupRank(group),
              ": allreduce of P failed: ", fut->tryRetrieveErrorMessage());
}

void endPowerSgdStep(PowerSgdState& state, bool isLast) {
  if (!state.options.warmStart) {
    state.pMemoryDict.clear();
    state.qMemoryDict.clear();
  }
  state.maybeIncreaseIter(isLast);
}

}  // namespace tunedist::hooks
