#include "core/options.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace tunedist::shm {
namespace {

bool readEnvInt(const char* name, long long* out) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    return false;
  }
  char* end = nullptr;
  errno = 0;
  long long parsed = std::strtoll(v, &end, 10);
  TD_CHECK(errno == 0 && end != nullptr && *end == '\0' && parsed >= 0, "tunedist: environment variable ", name,
           "='", v, "' is not a non-negative integer");
  *out = parsed;
  return true;
}

}  // namespace

ShmOptions ShmOptions::fromEnv() {
  ShmOptions o;
  long long v = 0;
  if (readEnvInt("TUNEDIST_SLOT_BYTES", &v)) {
    o.slotBytes = size_t(v);
  }
  if (readEnvInt("TUNEDIST_ONESHOT_MAX_BYTES", &v)) {
    o.oneShotMaxBytes = size_t(v);
  }
  if (readEnvInt("TUNEDIST_SPIN_ITERS", &v)) {
    o.spinIters = int(v);
  }
  if (readEnvInt("TUNEDIST_DEAD_AFTER_MS", &v)) {
    o.deadAfter = std::chrono::milliseconds(v);
  }
  if (readEnvInt("TUNEDIST_HEARTBEAT_MS", &v)) {
    o.heartbeatPeriod = std::chrono::milliseconds(v);
  }
  o.validate();
  return o;
}

void ShmOptions::validate() const {
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

}  // namespace tunedist::shm
