// Progress: everything the engine's progress thread owns and does between sleeps. It owns one send and one receive
// channel per peer and the matcher between the receive channels and the posted receives; it posts new operations,
// runs one pass of work over the channels, fails everything, and says what a sleep must watch.
//
// One pass: write queued sends into their rings, read messages out of the rings that somebody here waits for, look
// up rings not found yet in the rendezvous, and fail operations past their deadline or whose peer is gone.
//
// What fails what: see send_channel.h and recv_channel.h for one channel; abort and shutdown (failAll, close) fail
// everything and mark all our rings closed, so peers stop waiting for us.
#pragma once

#include <string>
#include <vector>

#include "shm/p2p/context.h"
#include "shm/p2p/matcher.h"
#include "shm/p2p/op.h"
#include "shm/p2p/recv_channel.h"
#include "shm/p2p/send_channel.h"

namespace tunedist::shm::p2p {

class Progress {
 public:
  // `ctx` must outlive this; its rendezvous and heartbeat are used from the first pass on.
  Progress(const Context& ctx, int size);

  // A new operation from the inbox.
  void post(OpPtr op);
  // One pass of work. True if anything moved.
  bool pass(Clock::time_point now);
  bool hasPendingWork() const;
  // Before a sleep: adds to `bells` the rings it must watch and brings `until` forward to the nearest deadline,
  // rendezvous poll or peer check. True if something is ready already (then do not sleep).
  bool watch(BellSet& bells, Clock::time_point* until) const;

  // Fails every pending operation with `reason` and marks all our rings closed.
  void failAll(const std::string& reason);
  // Shutdown: fails `late` (operations posted while stopping) and everything pending with `why`; with
  // `lingerForReceivers`, first waits a moment for receivers that have not mapped rings that hold our messages.
  void close(const std::string& why, bool lingerForReceivers, std::vector<OpPtr> late);

 private:
  void postReceive(OpPtr op);
  bool discover(Clock::time_point now);
  void expire(Clock::time_point now);
  void checkPeers(Clock::time_point now);
  std::string receiveStall(const Op& op) const;
  Clock::time_point earliestDeadline() const;

  const Context& ctx_;
  Matcher matcher_;
  std::vector<SendChannel> out_;  // out_[dst]
  std::vector<RecvChannel> in_;   // in_[src]
  Clock::time_point nextPeerCheck_{};
  size_t discoverCursor_ = 0;
};

}  // namespace tunedist::shm::p2p
