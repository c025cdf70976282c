// SendChannel: our messages to one peer (us -> dst), sent in order through the ring we create. It owns the ring, the
// queue of sends and their progress (pump), and how they fail.
//
// A send (us -> dst), in order per destination:
//   1. The first send to dst creates the ring (ShmSegment::create) and announces its name under
//      tunedist_p2p_<src>_<dst>.
//   2. When 64 bytes are free at head: write the message header. Then copy the payload in chunks as space frees,
//      publishing head (release) after each chunk, so the receiver drains while we fill.
//   3. The send completes when its last byte (plus padding) is in the ring: the caller's buffer is free again.
//
// Failures: a send past its deadline fails (TimeoutError) and so does the channel: the sends queued behind it, and
// every later send to that peer, since the pair's message order can no longer be kept. A receiver that closed or
// died fails the channel (PeerDeadError), also one that died before it mapped the ring (peers.h). A size mismatch
// the receiver reports through the ring fails the next send that starts.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "shm/p2p/context.h"
#include "shm/p2p/op.h"
#include "shm/p2p/ring.h"

namespace tunedist::shm::p2p {

class SendChannel {
 public:
  SendChannel(const Context& ctx, int dst) : ctx_(ctx), dst_(dst) {}

  // Queues a send; fails it at once if the channel failed.
  void post(OpPtr op);
  bool busy() const { return !queue_.empty(); }
  bool failed() const { return !failure_.empty(); }
  // Moves the queued sends into the ring as far as it has room. True if anything moved.
  bool pump();

  // Fails a send past its deadline, and the channel with it.
  void expire(Clock::time_point now);
  // Fails the channel if the receiver closed or died while sends wait.
  void checkPeer(Clock::time_point now);
  // Fails every queued send and every later one with `why` (PeerDeadError when `dead`) and marks our side of the
  // ring closed.
  void fail(const std::string& why, bool dead);

  // Before a sleep: watches the ring's bell if sends wait on it; true if the ring is ready for us already.
  bool watch(BellSet& bells) const;
  Clock::time_point earliestDeadline() const;
  // The ring holds complete messages and the channel is sound: its receiver may still come to read them.
  bool holdsUnseen() const { return ring_ != nullptr && failure_.empty() && head_ > 0; }
  // The receiver has neither mapped the ring nor closed.
  bool receiverAbsent() const;

 private:
  bool createRing();
  bool canWrite() const;
  bool takeReport();
  void rejectFront();
  uint64_t writeFront(uint64_t* budget);

  const Context& ctx_;
  const int dst_;
  std::unique_ptr<P2pRing> ring_;
  std::vector<std::unique_ptr<P2pRing>> abandoned_;  // rings whose announcement failed (createRing)
  uint64_t head_ = 0;                                // our written-bytes cursor (published into the ring)
  uint64_t nextSeq_ = 1;
  std::deque<OpPtr> queue_;
  std::string peerError_;  // the receiver's report, for the next send that starts
  std::string failure_;    // set once the channel is unusable (a send failed half-written, peer gone)
  bool failureIsDead_ = false;
};

}  // namespace tunedist::shm::p2p
