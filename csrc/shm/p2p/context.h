// What every channel of one engine shares: who we are, the options, the rendezvous that rings are announced in, the
// heartbeat that keeps our side of every mapped ring alive, and the peers' published identities (for peers that
// have no ring with us yet). Owned by the engine; channels keep a reference.
#pragma once

#include <cstddef>

#include "core/options.h"
#include "core/rendezvous.h"
#include "shm/p2p/heartbeat.h"
#include "shm/p2p/peers.h"

namespace tunedist::shm::p2p {

struct Context {
  int rank;
  const core::ShmOptions& options;
  size_t chunkBytes;  // the most bytes one copy moves before the pass looks at the other channels
  core::Rendezvous* rendezvous;
  Heartbeat* heartbeat;
  PeerIdentities* peers;  // progress thread only
};

}  // namespace tunedist::shm::p2p
