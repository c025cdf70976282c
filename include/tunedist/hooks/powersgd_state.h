// PowerSgdState: hyperparameters and per-bucket state of the PowerSGD hooks, field for field torch's
// `PowerSGDState` (torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py), plus tunedist's reusable work
// buffers. Shared (std::shared_ptr) by the Python `tunedist.hooks.powerSGD.PowerSGDState` and the C++ hook.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "tunedist/hooks/numpy_random.h"

namespace tunedist::hooks {

// torch's constructor arguments and defaults.
struct PowerSgdOptions {
  static constexpr int64_t kDefaultStartIter = 1000;
  static constexpr int64_t kDefaultStatsLoggingFrequency = 10000;

  int64_t matrixApproximationRank = 1;
  int64_t startPowerSgdIter = kDefaultStartIter;
  double minCompressionRate = 2;
  bool useErrorFeedback = true;
  bool warmStart = true;
  double orthogonalizationEpsilon = 0;
  uint32_t randomSeed = 0;
  int64_t compressionStatsLoggingFrequency = kDefaultStatsLoggingFrequency;
  bool batchTensorsWithSameShape = false;
};

// Reused between steps, per bucket index: never part of the checkpointed state.
struct PowerSgdWorkspace {
  at::Tensor uncompressed;  // the concatenated uncompressed gradients (powerSGD_hook)
  at::Tensor padded;        // the bucket padded to s*s (batched_powerSGD_hook)
  at::Tensor p;             // P and Q memories when warm start is off (the dicts are cleared every step)
  at::Tensor q;
  std::vector<at::Tensor> stacked;  // stacked same-shape gradients (batch_tensors_with_same_shape)
};

class PowerSgdState {
 public:
  // Throws c10::ValueError as torch's does when error feedback or warm start is on and startPowerSgdIter <= 1
  // (DDP rebuilds its buckets after the first iteration).
  explicit PowerSgdState(const PowerSgdOptions& options);

  // The mutex guards everything below: a bucket's decompression runs on the backend's thread while the next
  // bucket's hook starts on the autograd thread.
  std::mutex mutex;
  PowerSgdOptions options;
  NumpyRandomState rng;
  std::map<int64_t, at::Tensor> errorDict;
  std::map<int64_t, at::Tensor> pMemoryDict;
  std::map<int64_t, at::Tensor> qMemoryDict;
  std::map<int64_t, PowerSgdWorkspace> workspaces;
  int64_t iter = 0;
  int64_t totalNumelBeforeCompression = 0;
  int64_t totalNumelAfterCompression = 0;
  int64_t nextStatsReport = 0;

  // (compress rate, numel before, numel after); rate 0 before anything was compressed. Caller holds mutex.
  std::tuple<double, int64_t, int64_t> compressionStats() const;
  // iter += 1 after the last bucket of a step (isLast: GradBucket::isLast()). Caller holds mutex.
  void maybeIncreaseIter(bool isLast);
  // Logs the statistics (LOG(INFO)) after the last bucket once iter reaches nextStatsReport. Caller holds mutex.
  void reportCompressionStats(const c10d::GradBucket& bucket);
  // Bytes held by the workspaces (not the checkpointed memories).
  int64_t workspaceBytes();
};

}  // namespace tunedist::hooks
