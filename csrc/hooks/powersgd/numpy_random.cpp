// numpy's legacy MT19937 (randomkit) and its masked-rejection bounded integers, PowerSGD's seed source; see
// tunedist/hooks/numpy_random.h.
#include "tunedist/hooks/numpy_random.h"

#include <stdexcept>

namespace tunedist::hooks {
namespace {

constexpr int kN = NumpyRandomState::kStateWords;
constexpr int kM = 397;
constexpr uint32_t kMatrixA = 0x9908b0dfu;
constexpr uint32_t kUpperMask = 0x80000000u;
constexpr uint32_t kLowerMask = 0x7fffffffu;

uint32_t twist(uint32_t upper, uint32_t lower, uint32_t far) {
  const uint32_t y = (upper & kUpperMask) | (lower & kLowerMask);
  return far ^ (y >> 1) ^ ((y & 1u) ? kMatrixA : 0u);
}

// Smallest 2^k - 1 >= v.
uint64_t maskFor(uint64_t v) {
  v |= v >> 1;
  v |= v >> 2;
  v |= v >> 4;
  v |= v >> 8;
  v |= v >> 16;
  v |= v >> 32;
  return v;
}

}  // namespace

void NumpyRandomState::seed_(uint32_t seed) {
  key_[0] = seed;
  for (int i = 1; i < kN; ++i) {
    key_[i] = 1812433253u * (key_[i - 1] ^ (key_[i - 1] >> 30)) + static_cast<uint32_t>(i);
  }
  pos_ = kN;
}

void NumpyRandomState::regenerate() {
  for (int i = 0; i < kN - kM; ++i) key_[i] = twist(key_[i], key_[i + 1], key_[i + kM]);
  for (int i = kN - kM; i < kN - 1; ++i) key_[i] = twist(key_[i], key_[i + 1], key_[i + kM - kN]);
  key_[kN - 1] = twist(key_[kN - 1], key_[0], key_[kM - 1]);
  pos_ = 0;
}

uint32_t NumpyRandomState::nextUint32() {
  if (pos_ == kN) regenerate();
  uint32_t y = key_[pos_++];
  // Tempering.
  y ^= (y >> 11);
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= (y >> 18);
  return y;
}

int64_t NumpyRandomState::randint(int64_t high) {
  if (high <= 0) throw std::invalid_argument("NumpyRandomState::randint: high must be positive (numpy: low >= high)");
  const uint64_t range = static_cast<uint64_t>(high) - 1;  // inclusive upper bound, as numpy's `rng`
  if (range == 0) return 0;
  if (range <= 0xFFFFFFFFull) {
    if (range == 0xFFFFFFFFull) return nextUint32();
    const uint32_t mask = static_cast<uint32_t>(maskFor(range));
    uint32_t v;
    while ((v = nextUint32() & mask) > range) {
    }
    return v;
  }
  const uint64_t mask = maskFor(range);
  uint64_t v;
  do {
    const uint64_t hi = nextUint32();
    v = ((hi << 32) | nextUint32()) & mask;
  } while (v > range);
  return static_cast<int64_t>(v);
}

void NumpyRandomState::setState(const std::array<uint32_t, kStateWords>& key, int pos) {
  if (pos < 0 || pos > kN) throw std::invalid_argument("NumpyRandomState::setState: pos must be in [0, 624]");
  key_ = key;
  pos_ = pos;
}

}  // namespace tunedist::hooks
