#include "core/options.h"

#include <algorithm>

#include "core/cpus.h"
#include "core/env.h"
#include "core/error.h"

namespace tunedist::core {
namespace {
constexpr SlotStores kAllSlotStores[] = {SlotStores::kAuto, SlotStores::kCached, SlotStores::kStreaming};
}  // namespace

const char* slotStoresName(SlotStores mode) {
  switch (mode) {
    case SlotStores::kAuto: return "auto";
    case SlotStores::kCached: return "cached";
    case SlotStores::kStreaming: return "streaming";
  }
  return "?";
}

ShmOptions ShmOptions::forRanks(int localRanks) const {
  ShmOptions o = *this;
  if (o.spinIters == kSpinItersAuto) {
    o.spinIters = std::max(localRanks, localWorldSize) <= usableCpus() ? kDefaultSpinIters : 0;
  }
  return o;
}

ShmOptions ShmOptions::fromEnv() {
  ShmOptions o;
  if (auto v = envNonNegativeInt("TUNEDIST_SLOT_BYTES")) {
    o.slotBytes = size_t(*v);
  }
  if (auto v = envNonNegativeInt("TUNEDIST_ONESHOT_MAX_BYTES")) {
    o.oneShotMaxBytes = size_t(*v);
    o.halfOneShotMaxBytes = size_t(*v);
  }
  if (auto v = envNonNegativeInt("TUNEDIST_CACHED_COPY_MAX_BYTES")) {
    o.cachedCopyMaxBytes = size_t(*v);
  }
  if (auto v = envNonNegativeInt("TUNEDIST_BROADCAST_CACHED_COPY_MAX_BYTES")) {
    o.broadcastCachedCopyMaxBytes = size_t(*v);
  }
  if (auto v = envNonNegativeInt("TUNEDIST_BROADCAST_STREAM_BELOW_BYTES")) {
    o.broadcastStreamBelowBytes = size_t(*v);
  }
  if (auto v = envNonNegativeInt("TUNEDIST_FUSED_OWN_COPY_MIN_BYTES")) {
    o.fusedOwnCopyMinBytes = size_t(*v);
  }
  if (auto v = envNonNegativeInt("TUNEDIST_OWN_CACHED_COPY_MAX_BYTES")) {
    o.ownCachedCopyMaxBytes = size_t(*v);
  }
  if (auto v = envString("TUNEDIST_SLOT_STORES")) {
    bool known = false;
    for (SlotStores mode : kAllSlotStores) {
      if (*v == slotStoresName(mode)) {
        o.slotStores = mode;
        known = true;
      }
    }
    TD_CHECK(known, "tunedist: TUNEDIST_SLOT_STORES must be auto, cached or streaming, got '", *v, "'");
  }
  if (auto v = envNonNegativeInt("TUNEDIST_SPIN_ITERS")) {
    o.spinIters = int(*v);
  }
  if (auto v = envNonNegativeInt("LOCAL_WORLD_SIZE")) {
    o.localWorldSize = int(std::min<long long>(*v, 1 << 20));
  }
  if (auto v = envNonNegativeInt("TUNEDIST_DEAD_AFTER_MS")) {
    o.deadAfter = std::chrono::milliseconds(*v);
  }
  if (auto v = envNonNegativeInt("TUNEDIST_HEARTBEAT_MS")) {
    o.heartbeatPeriod = std::chrono::milliseconds(*v);
  }
  if (auto v = envNonNegativeInt("TUNEDIST_SWEEP_MIN_AGE_S")) {
    o.sweepMinAge = std::chrono::seconds(*v);
  }
  if (auto v = envNonNegativeInt("TUNEDIST_SYMMETRIC_MIN_BYTES")) {
    o.symmetricMinBytes = size_t(*v);
  }
  if (auto v = envNonNegativeInt("TUNEDIST_SYMMETRIC_CHUNK_BYTES")) {
    o.symmetricChunkBytes = size_t(*v);
  }
  if (auto v = envNonNegativeInt("TUNEDIST_SYMMETRIC_HEAP_BYTES")) {
    o.symmetricHeapBytes = size_t(*v);
  }
  o.validate();
  return o;
}

size_t ShmOptions::oneShotMaxBytesFor(DType dtype) const {
  const bool half = dtype == DType::kBFloat16 || dtype == DType::kFloat16;
  return std::min({oneShotMaxBytes, half ? halfOneShotMaxBytes : oneShotMaxBytes, slotBytes});
}

void ShmOptions::validate() const {
  TD_CHECK(spinIters >= kSpinItersAuto, "tunedist: spinIters (TUNEDIST_SPIN_ITERS) must be at least 0, or ",
           kSpinItersAuto, " for the default, got ", spinIters);
  TD_CHECK(slotBytes >= 4096 && slotBytes % 4096 == 0, "tunedist: slotBytes (TUNEDIST_SLOT_BYTES) must be a multiple ",
           "of 4096 and at least 4096, got ", slotBytes);
  TD_CHECK(slotBytes <= (size_t(1) << 30), "tunedist: slotBytes (TUNEDIST_SLOT_BYTES) must be at most 1 GiB, got ",
           slotBytes);
  TD_CHECK(p2pChannelBytes >= 4096 && p2pChannelBytes % 64 == 0,
           "tunedist: p2pChannelBytes must be a multiple of 64 and at least 4096, got ", p2pChannelBytes);
  TD_CHECK(heartbeatPeriod.count() > 0, "tunedist: heartbeat period must be positive");
  TD_CHECK(deadAfter >= 2 * heartbeatPeriod, "tunedist: deadAfter (", deadAfter.count(),
           " ms) must be at least twice the heartbeat period (", heartbeatPeriod.count(), " ms)");
  TD_CHECK(sleepSlice.count() > 0, "tunedist: sleepSlice must be positive");
}

CrossHostOptions CrossHostOptions::fromEnv() {
  CrossHostOptions o;
  if (auto v = envNonNegativeInt("TUNEDIST_CROSS_HOST_CHUNK_BYTES")) {
    o.chunkBytes = size_t(*v);
  }
  o.validate();
  return o;
}

void CrossHostOptions::validate() const {
  TD_CHECK(!chunkBytes || *chunkBytes >= 4096,
           "tunedist: the cross-host chunk (TUNEDIST_CROSS_HOST_CHUNK_BYTES) must be at least 4096 bytes, got ",
           chunkBytes.value_or(0));
}

size_t CrossHostOptions::chunkBytesFor(size_t bytes) const {
  if (chunkBytes) {
    return *chunkBytes;
  }
  return std::clamp(bytes / kTargetChunks, kMinChunkBytes, kMaxChunkBytes);
}

}  // namespace tunedist::core
