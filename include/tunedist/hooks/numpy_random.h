// NumpyRandomState: numpy's legacy `np.random.RandomState` generator (MT19937 with init_genrand seeding) and its
// bounded `randint`, so that C++ code draws exactly the seeds torch's PowerSGD hook draws from
// `np.random.RandomState(random_seed).randint(1_000_000_000)`. Torch-free; the state (624 key words + position)
// round-trips through numpy's `RandomState.get_state()` tuple ('MT19937', key, pos, has_gauss=0, gauss=0.0).
#pragma once

#include <array>
#include <cstdint>

namespace tunedist::hooks {

class NumpyRandomState {
 public:
  static constexpr int kStateWords = 624;

  explicit NumpyRandomState(uint32_t seed = 0) { seed_(seed); }

  // numpy's RandomState.seed(int): init_genrand, position at the end (the next draw regenerates the block).
  void seed_(uint32_t seed);
  // One raw 32-bit output (numpy's next_uint32 / legacy random_uint32).
  uint32_t nextUint32();
  // numpy's RandomState.randint(high) with the default int64 dtype: uniform in [0, high), drawn by masked
  // rejection (mask = next power of two minus one); ranges that fit 32 bits use one 32-bit draw per try,
  // wider ones a 64-bit draw (high word first). Throws std::invalid_argument for high <= 0.
  int64_t randint(int64_t high);

  const std::array<uint32_t, kStateWords>& key() const { return key_; }
  int pos() const { return pos_; }
  // Sets the state as numpy's set_state does; throws std::invalid_argument for pos outside [0, 624].
  void setState(const std::array<uint32_t, kStateWords>& key, int pos);

 private:
  void regenerate();

  std::array<uint32_t, kStateWords> key_{};
  int pos_ = kStateWords;
};

}  // namespace tunedist::hooks
