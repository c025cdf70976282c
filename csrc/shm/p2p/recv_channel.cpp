#include "shm/p2p/recv_channel.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/store_keys.h"

namespace tunedist::shm::p2p {
namespace {

// Rendezvous polls for a ring not found yet: first at once, then ever less often up to kMaxPoll.
constexpr std::chrono::microseconds kFirstPoll{500};
constexpr std::chrono::microseconds kMaxPoll{20000};
constexpr std::chrono::milliseconds kAnnounceGetTimeout{10000};

}  // namespace

bool RecvChannel::admit(OpPtr& op) {
  if (!failure_.empty() && (op->peer >= 0 || failureFailsAnySource_)) {
    std::exception_ptr error = channelError(*op, ctx_.rank, failure_, failureIsDead_);
    p2p::fail(std::move(op), std::move(error));
    return false;
  }
  // A new receive looks for a missing ring at once (poll() backs off again while nothing comes).
  pollInterval_ = std::chrono::microseconds(0);
  nextPoll_ = Clock::time_point{};
  return true;
}

bool RecvChannel::poll(Clock::time_point now) {
  pollInterval_ = std::clamp(pollInterval_ * 2, kFirstPoll, kMaxPoll);
  nextPoll_ = now + pollInterval_;
  try {
    // The sender's liveness before its announcement: one that announced and then died is read as announced (its
    // messages are delivered first), one that is gone and never announced has sent nothing and never will.
    int32_t pid = 0;
    const bool gone = ctx_.peers->certainlyGone(src_, &pid);
    std::string key = core::keys::p2pRing(src_, ctx_.rank);
    if (!ctx_.rendezvous->check(key)) {
      if (gone) {
        fail(core::detail::str("rank ", src_, " is dead: its process (pid ", pid,
                               ") has exited before it sent anything to this rank"),
             true, true);
        return true;
      }
      return false;
    }
    std::string name = ctx_.rendezvous->get(key, kAnnounceGetTimeout);
    ring_ = P2pRing::open(name, src_, ctx_.rank, ctx_.options.p2pChannelBytes,
                          [this](core::LifeLock* l) { ctx_.heartbeat->hold(l); });
    if (ring_ == nullptr) {
      return senderGone(name, now);
    }
  } catch (const std::exception& e) {
    fail(e.what(), false, true);
    return true;
  }
  ctx_.heartbeat->add(*ring_);
  return true;
}

// The announced ring no longer exists: the sender was destroyed before we came (its messages are lost), or the
// announcement is stale and a fresh one may still replace it. Give it deadAfter, as for a silent heartbeat.
bool RecvChannel::senderGone(const std::string& name, Clock::time_point now) {
  if (staleName_ != name) {
    staleName_ = name;
    staleSince_ = now;
    return false;
  }
  if (now - staleSince_ <= ctx_.options.deadAfter) {
    return false;
  }
  fail(core::detail::str("rank ", src_, " closed its point-to-point channel to this rank (", name,
                         ") before this rank attached to it: its process group was destroyed, and messages it sent and "
                         "this rank did not receive are lost"),
       true, false);
  return true;
}

bool RecvChannel::pump() {
  bool moved = false;
  uint64_t budget = ring_->capacity();
  while (budget > 0 && failure_.empty()) {
    // Acquire: the bytes before head are written.
    uint64_t head = ring_->header().head.load(std::memory_order_acquire);
    uint64_t before = tail_;
    if (!inMessage_ && (head - tail_ < kCacheLine || !startMessage())) {
      break;
    }
    uint64_t n = drain(head, budget);
    budget -= n;
    if (tail_ != before) {
      // Release: we are done with the bytes before tail; the sender may overwrite them.
      ring_->publishCursor(tail_);
      moved = true;
    }
    if (consumed_ == roundUp(message_.bytes, kCacheLine)) {
      finishMessage();
      moved = true;
    } else if (n == 0) {
      break;
    }
  }
  return moved;
}

// Step 3: reads the next message's header and decides where its payload goes. False when the message stays in the
// ring (step 4) or the channel failed.
bool RecvChannel::startMessage() {
  P2pMsgHeader m{};
  ring_->read(tail_, &m, sizeof(m));
  if (m.magic != kP2pMsgMagic || m.seq != nextSeq_) {
    fail(core::detail::str("protocol error on the channel from rank ", src_, ": message ", nextSeq_, " has magic ",
                           std::hex, m.magic, std::dec, " and sequence ", m.seq,
                           " (memory corruption, or ranks running different tunedist builds)"),
         false, false);
    return false;
  }
  bool wanted = false;
  OpPtr op = matcher_.match(src_, m.tag, &wanted);
  if (!wanted) {
    return false;  // Step 4: leave it in the ring.
  }
  message_ = m;
  inMessage_ = true;
  consumed_ = 0;
  tail_ += kCacheLine;
  ++nextSeq_;
  if (op == nullptr) {
    // Step 3, not matched: buffer it so messages behind it can reach their receives.
    unexpected_ = matcher_.arrive(src_, m.tag, size_t(m.bytes));
    dest_ = Dest::kUnexpected;
    return true;
  }
  if (op->bytes != m.bytes) {
    std::string msg = sizeMismatch(*op, ctx_.rank, src_, m.tag, size_t(m.bytes));
    reportToSender(msg);
    dest_ = Dest::kDiscard;
    p2p::fail(std::move(op), errorOf<core::Error>(msg));
    return true;
  }
  dest_ = Dest::kReceive;
  receive_ = std::move(op);
  return true;
}

// Consumes up to `budget` payload bytes of the current message (those before `head`), copying them to where the
// message goes. Returns the bytes consumed.
uint64_t RecvChannel::drain(uint64_t head, uint64_t budget) {
  const uint64_t span = roundUp(message_.bytes, kCacheLine);
  uint64_t n = std::min({head - tail_, span - consumed_, uint64_t(ctx_.chunkBytes), budget});
  if (n == 0) {
    return 0;
  }
  char* dest = nullptr;
  if (dest_ == Dest::kReceive) {
    dest = receive_->data;
  } else if (dest_ == Dest::kUnexpected && !unexpected_->dropped) {
    dest = unexpected_->data.get();
  }
  if (dest != nullptr && consumed_ < message_.bytes) {
    ring_->read(tail_, dest + consumed_, size_t(std::min<uint64_t>(n, message_.bytes - consumed_)));
  }
  tail_ += n;
  consumed_ += n;
  return n;
}

void RecvChannel::finishMessage() {
  inMessage_ = false;
  if (dest_ == Dest::kReceive) {
    complete(std::move(receive_), src_);
  } else if (dest_ == Dest::kUnexpected) {
    matcher_.finish(unexpected_);
  }
  dest_ = Dest::kDiscard;
}

void RecvChannel::expire(Clock::time_point now) {
  if (receive_ == nullptr || receive_->deadline > now) {
    return;
  }
  OpPtr op = std::move(receive_);
  dest_ = Dest::kDiscard;  // the rest of the message is drained and dropped
  std::exception_ptr error = timeoutError(*op, ctx_.rank,
                                          core::detail::str("the message from rank ", src_, " stopped arriving after ",
                                                            consumed_, " of ", op->bytes, " bytes"));
  p2p::fail(std::move(op), std::move(error));
}

void RecvChannel::checkPeer(Clock::time_point now, bool wanted) {
  if (!active(wanted)) {
    return;
  }
  if (ring_->header().head.load(std::memory_order_acquire) != tail_) {
    return;  // deliver what the peer wrote before judging it
  }
  std::string reason;
  P2pRing::PeerState state = ring_->peerState(now, ctx_.options.deadAfter, &reason);
  if (state == P2pRing::PeerState::kClosed || state == P2pRing::PeerState::kDead) {
    fail(core::detail::str("rank ", src_, " ", reason), true, state == P2pRing::PeerState::kDead);
  }
}

void RecvChannel::fail(const std::string& why, bool dead, bool anySourceToo) {
  failure_ = why;
  failureIsDead_ = dead;
  failureFailsAnySource_ = anySourceToo;
  if (inMessage_) {
    if (dest_ == Dest::kReceive) {
      OpPtr op = std::move(receive_);
      std::exception_ptr error = opError(*op, ctx_.rank, why, dead);
      p2p::fail(std::move(op), std::move(error));
    } else if (dest_ == Dest::kUnexpected) {
      matcher_.abandon(unexpected_, why, dead);
    }
    inMessage_ = false;
    dest_ = Dest::kDiscard;
  }
  matcher_.failFrom(src_, anySourceToo, why, dead);
}

void RecvChannel::close() {
  if (ring_ != nullptr) {
    ring_->markClosed();
  }
}

void RecvChannel::reportToSender(const std::string& text) {
  if (ring_ == nullptr) {
    return;
  }
  P2pRingHeader& h = ring_->header();
  uint32_t expected = uint32_t(P2pErrorState::kEmpty);
  // One report at a time: while the sender has not taken the previous one, it already has an error to raise.
  if (!h.errorState.compare_exchange_strong(expected, uint32_t(P2pErrorState::kWriting), std::memory_order_acquire)) {
    return;
  }
  size_t n = std::min(text.size(), kP2pErrorBytes - 1);
  std::memcpy(h.errorText, text.data(), n);
  h.errorText[n] = '\0';
  // Release: the sender that sees kPosted sees the whole text.
  h.errorState.store(uint32_t(P2pErrorState::kPosted), std::memory_order_seq_cst);
  ring_->notify();
}

std::string RecvChannel::stall(const Op& op) const {
  if (ring_ == nullptr && !staleName_.empty()) {
    return core::detail::str("rank ", src_, " announced a channel (", staleName_,
                             ") that no longer exists: it destroyed its process group before this rank received");
  }
  if (ring_ == nullptr) {
    return core::detail::str("rank ", src_,
                             " has sent nothing to this rank yet. Check that it calls the matching send");
  }
  return core::detail::str("no message with tag ", op.tag, " came from rank ", src_, " (", nextSeq_ - 1,
                           " messages received from it so far). Check the matching send's tag and order");
}

bool RecvChannel::watch(BellSet& bells, bool wanted, Clock::time_point* until) const {
  if (ring_ == nullptr || !failure_.empty()) {
    if (ring_ == nullptr && failure_.empty() && wanted) {
      *until = std::min(*until, nextPoll_);
    }
    return false;
  }
  if (!inMessage_ && !wanted) {
    return false;
  }
  bells.add(*ring_);
  return ring_->header().head.load(std::memory_order_seq_cst) != tail_;
}

Clock::time_point RecvChannel::earliestDeadline() const {
  return receive_ != nullptr ? receive_->deadline : Clock::time_point::max();
}

}  // namespace tunedist::shm::p2p
