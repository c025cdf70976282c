// PeerIdentities: every engine's process identity (pid, pid namespace, start time), written to the rendezvous when
// the engine is made. A ring carries its two ends' identities and life locks, so a peer is watched from the moment
// it has a ring with this rank; a peer that dies before that (a receive waiting for a sender that never announced
// its ring, a send waiting for a receiver that never mapped ours) is found through its published identity instead
// of at the operation's timeout. Only where the peer's pid namespace is ours (core::processCertainlyGone); a peer
// that died before it made its engine (before its first operation of any kind) still shows only at the timeout.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/rendezvous.h"
#include "core/sync.h"

namespace tunedist::shm::p2p {

class PeerIdentities {
 public:
  PeerIdentities(core::Rendezvous* rendezvous, int size) : rendezvous_(rendezvous), known_(size_t(size)) {}

  // Writes this process's identity as `rank`'s (one store write, no waiting).
  void publish(int rank);
  // True when `peer` has published its identity and that process is certainly gone; its pid in `*pid`. Looks the
  // identity up in the rendezvous until it is there (one check per call), then keeps it. Progress thread only.
  bool certainlyGone(int peer, int32_t* pid);

 private:
  core::Rendezvous* rendezvous_;
  std::vector<std::optional<core::ProcessIdentity>> known_;  // known_[peer]
};

}  // namespace tunedist::shm::p2p
