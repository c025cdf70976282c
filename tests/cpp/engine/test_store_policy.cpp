// StorePolicy outside a chooser's Scope (a group of one here; also operations under RoundStoreChooser::kMinBytes and
// forced stores): every mode copies exactly the bytes asked for into the slot, and copyInAndOwn fills the slot and the
// own block in one pass. The round chooser itself: test_round_stores.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "core/options.h"
#include "shm/store_policy.h"

namespace tunedist::test {
namespace {

using core::SlotStores;
using shm::StorePolicy;
constexpr size_t kBig = size_t(8) << 10;

std::vector<uint8_t> pattern(size_t n, uint8_t salt) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = uint8_t(i * 131 + salt);
  }
  return v;
}

// A group of one: the Scope never consults a chooser, so it reads nothing from the site's shared state.
StorePolicy::Site loneSite(const bool* probeRequest) { return StorePolicy::Site{nullptr, 0, 1, nullptr, probeRequest}; }

core::ShmOptions withStores(SlotStores mode) {
  core::ShmOptions o;
  o.slotStores = mode;
  return o;
}

}  // namespace

TEST_CASE("every slot store mode copies exactly the bytes asked for", "[store_policy]") {
  const SlotStores mode = GENERATE(SlotStores::kAuto, SlotStores::kCached, SlotStores::kStreaming);
  const bool readersOnly = GENERATE(false, true);  // copyInStreaming (a broadcast root's copy)
  StorePolicy policy(withStores(mode));
  const bool probeRequest = false;
  for (size_t bytes : {size_t(0), size_t(1), size_t(63), kBig - 1, kBig, size_t(65537), size_t(1) << 20}) {
    for (size_t shift : {size_t(0), size_t(3)}) {
      INFO("mode " << int(mode) << (readersOnly ? " (streaming unless forced)" : "") << ", " << bytes
                   << " bytes, destination shifted by " << shift);
      const auto src = pattern(bytes + shift, uint8_t(bytes));
      std::vector<uint8_t> dst(bytes + 2 * shift + 64, 0xA5);
      StorePolicy::Scope stores(policy, StorePolicy::kAllgather, bytes, loneSite(&probeRequest));
      CHECK_FALSE(stores.active());
      if (readersOnly) {
        stores.copyInStreaming(dst.data() + shift, src.data() + shift, bytes);
      } else {
        stores.copyIn(dst.data() + shift, src.data() + shift, bytes);
      }
      stores.done();
      CHECK(std::equal(src.begin() + long(shift), src.end(), dst.begin() + long(shift)));
      for (size_t i = 0; i < shift; ++i) {
        CHECK(dst[i] == 0xA5);
      }
      for (size_t i = shift + bytes; i < dst.size(); ++i) {
        CHECK(dst[i] == 0xA5);
      }
    }
  }
}

TEST_CASE("copyInAndOwn fills the slot and the own block in one pass", "[store_policy]") {
  const SlotStores mode = GENERATE(SlotStores::kAuto, SlotStores::kCached, SlotStores::kStreaming);
  const bool streamOwn = GENERATE(false, true);
  StorePolicy policy(withStores(mode));
  const bool probeRequest = false;
  for (size_t bytes : {size_t(0), size_t(63), kBig, size_t(65537)}) {
    for (uint64_t round = 0; round < 6; ++round) {
      INFO("mode " << int(mode) << ", " << bytes << " bytes, copy " << round << (streamOwn ? ", own streaming" : ""));
      const auto src = pattern(bytes, uint8_t(bytes + round));
      std::vector<uint8_t> slot(bytes + 64, 0xA5), own(bytes + 64, 0x5A);
      StorePolicy::Scope stores(policy, StorePolicy::kAllgather, bytes, loneSite(&probeRequest));
      stores.copyInAndOwn(slot.data() + 1, own.data() + 3, src.data(), bytes, streamOwn);
      stores.done();
      CHECK(std::equal(src.begin(), src.end(), slot.begin() + 1));
      CHECK((slot[0] == 0xA5 && slot[bytes + 1] == 0xA5 && own[2] == 0x5A && own[bytes + 3] == 0x5A));
      CHECK(std::equal(src.begin(), src.end(), own.begin() + 3));
    }
  }
}

}  // namespace tunedist::test
