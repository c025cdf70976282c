// What every channel of one engine shares: who we are, the options, the rendezvous that rings are announced in, and
// the heartbeat that keeps our side of every mapped ring alive. Owned by the engine; channels keep a reference.
#pragma once

#include <cstddef>

#include "core/options.h"
#include "core/rendezvous.h"
#include "shm/p2p/heartbeat.h"

namespace tunedist::shm::p2p {

struct Context {
  int rank;
  const core::ShmOptions& options;
  size_t chunkBytes;  // the most bytes one copy moves before the pass looks at the other channels
  core::Rendezvous* rendezvous;
  Heartbeat* heartbeat;
};

}  // namespace tunedist::shm::p2p
