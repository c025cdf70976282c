#include "shm/p2p/peers.h"

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "core/store_keys.h"

namespace tunedist::shm::p2p {
namespace {

constexpr std::chrono::milliseconds kGetTimeout{10000};

}  // namespace

void PeerIdentities::publish(int rank) {
  const core::ProcessIdentity self = core::ProcessIdentity::self();
  rendezvous_->set(core::keys::p2pIdentity(rank),
                   core::detail::str(self.pid, ":", self.pidNamespace, ":", self.startTime));
}

bool PeerIdentities::certainlyGone(int peer, int32_t* pid) {
  std::optional<core::ProcessIdentity>& who = known_[size_t(peer)];
  if (!who.has_value()) {
    const std::string key = core::keys::p2pIdentity(peer);
    if (!rendezvous_->check(key)) {
      return false;
    }
    const std::string text = rendezvous_->get(key, kGetTimeout);
    core::ProcessIdentity id{};
    TD_CHECK(std::sscanf(text.c_str(), "%" SCNd32 ":%" SCNu64 ":%" SCNu64, &id.pid, &id.pidNamespace, &id.startTime) ==
                 3,
             "tunedist: malformed point-to-point identity of rank ", peer, ": '", text, "'");
    who = id;
  }
  *pid = who->pid;
  return core::processCertainlyGone(*who);
}

}  // namespace tunedist::shm::p2p
