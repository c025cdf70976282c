// RecvChannel: the messages from one peer (src -> us), read out of the ring that peer created. It owns the ring once
// found, finding it, reading messages out of it (pump) into the receives the matcher hands it or into the
// unexpected queue, finishing them, and how they fail.
//
// A receive (src -> us):
//   1. Look in the unexpected queue first (messages that arrived before anybody wanted them; Matcher).
//   2. Otherwise post it. The first receive that wants src polls the rendezvous for src's ring; once found we map
//      it and unlink its name.
//   3. For each ring somebody here waits on: read the next message header and match it against the posted
//      receives in posting order (same source or any source, same tag). Matched: stream the payload into that
//      receive's buffer. Not matched: stream it into a heap buffer in the unexpected queue, so later messages of
//      other tags can flow. A message whose size differs from the receive fails that receive (and is dropped);
//      the sender hears of it through the ring's error report.
//   4. Nobody here wants src's messages at all: leave them in the ring, so the sender is flow-controlled.
//
// Failures: a receive past its deadline fails alone (TimeoutError); a message it was streaming is drained and
// dropped. A sender that closed (engine destroyed or aborted) or died (process gone, heartbeat silent for
// deadAfter) fails the receives waiting on it (PeerDeadError), but only once its ring is drained: messages it sent
// before it went away are still delivered. A dead sender also fails any-source receives (the group is broken); a
// sender that closed cleanly does not. A sender that died before it announced a ring to us is found through its
// published identity (peers.h) at the next rendezvous poll.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "shm/p2p/context.h"
#include "shm/p2p/layout.h"
#include "shm/p2p/matcher.h"
#include "shm/p2p/op.h"
#include "shm/p2p/ring.h"

namespace tunedist::shm::p2p {

class RecvChannel {
 public:
  RecvChannel(const Context& ctx, Matcher& matcher, int src) : ctx_(ctx), matcher_(matcher), src_(src) {}

  // A new receive that may take this channel's messages (step 2). Fails it and returns false when the channel
  // failed in a way that concerns it; otherwise makes a missing ring be looked for at once.
  bool admit(OpPtr& op);
  bool failed() const { return !failure_.empty(); }
  bool inMessage() const { return inMessage_; }
  // The ring is there and somebody here waits on it (`wanted`: a posted receive could take our next message).
  bool active(bool wanted) const { return ring_ != nullptr && failure_.empty() && (inMessage_ || wanted); }
  // Reads messages out of the ring as far as they are wanted and written (steps 3 and 4). True if anything moved.
  bool pump();

  // The ring is not found yet, somebody wants it, and the next poll is due.
  bool pollDue(Clock::time_point now, bool wanted) const {
    return ring_ == nullptr && failure_.empty() && wanted && now >= nextPoll_;
  }
  // Polls the rendezvous once for the sender's ring and maps it (step 2). True if anything moved.
  bool poll(Clock::time_point now);

  // Fails the receive streaming a message past its deadline; the rest of the message is drained and dropped.
  void expire(Clock::time_point now);
  // Fails the channel if the sender closed or died and everything it wrote is read.
  void checkPeer(Clock::time_point now, bool wanted);
  // Fails the message being read and the posted receives from src (and any-source ones when `anySourceToo`) with
  // `why` (PeerDeadError when `dead`), and every later receive from src.
  void fail(const std::string& why, bool dead, bool anySourceToo);
  // Marks our side of the ring closed, so the sender stops waiting for us.
  void close();
  // Tells the sender, through the ring's error report, that a message it sent was rejected.
  void reportToSender(const std::string& text);

  // Why a receive from src is still waiting, for its timeout error.
  std::string stall(const Op& op) const;
  // Before a sleep: watches the ring's bell if somebody waits on it; true if a message is there already. Brings
  // `until` forward to the next rendezvous poll while the ring is not found.
  bool watch(BellSet& bells, bool wanted, Clock::time_point* until) const;
  Clock::time_point earliestDeadline() const;

 private:
  enum class Dest { kReceive, kUnexpected, kDiscard };

  bool startMessage();
  uint64_t drain(uint64_t head, uint64_t budget);
  void finishMessage();
  bool senderGone(const std::string& name, Clock::time_point now);

  const Context& ctx_;
  Matcher& matcher_;
  const int src_;
  std::unique_ptr<P2pRing> ring_;
  uint64_t tail_ = 0;  // our consumed-bytes cursor (published into the ring)
  // Discovery: polling the rendezvous for the sender's announcement, with a growing interval.
  Clock::time_point nextPoll_{};
  std::chrono::microseconds pollInterval_{0};
  std::string staleName_;  // an announced name that no longer existed
  Clock::time_point staleSince_{};
  std::string failure_;                 // set once the channel is unusable (attach error, sender gone)
  bool failureIsDead_ = false;          // fail its receives with PeerDeadError
  bool failureFailsAnySource_ = false;  // the sender died (not closed cleanly): any-source receives fail too
  // The message being consumed.
  bool inMessage_ = false;
  P2pMsgHeader message_{};
  uint64_t consumed_ = 0;  // padded payload bytes consumed so far
  Dest dest_ = Dest::kDiscard;
  OpPtr receive_;
  Matcher::Arrival unexpected_;
  uint64_t nextSeq_ = 1;
};

}  // namespace tunedist::shm::p2p
