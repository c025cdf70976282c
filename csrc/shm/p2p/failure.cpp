// P2pEngine's failure paths: deadlines, peers that closed or died, broken channels, abort and shutdown.
//
// What fails what:
//   - a receive past its deadline fails alone (TimeoutError); a message it was streaming is drained and dropped;
//   - a send past its deadline fails (TimeoutError) and so does its channel: the sends queued behind it, and every
//     later send to that peer, since the pair's message order can no longer be kept;
//   - a peer that closed (engine destroyed or aborted) or died (process gone, heartbeat silent for deadAfter)
//     fails the operations waiting on it (PeerDeadError), but only once its ring is drained: messages it sent
//     before it went away are still delivered. A dead sender also fails any-source receives (the group is
//     broken); a sender that closed cleanly does not;
//   - abort and the destructor fail everything and mark all our rings closed, so peers stop waiting for us.
#include <string>

#include "core/error.h"
#include "shm/p2p/impl.h"

namespace tunedist::shm {
namespace {

std::string withoutPrefix(const std::string& s) {
  static constexpr const char* kPrefix = "tunedist: ";
  return s.rfind(kPrefix, 0) == 0 ? s.substr(std::char_traits<char>::length(kPrefix)) : s;
}

long long msBetween(P2pEngine::Clock::time_point a, P2pEngine::Clock::time_point b) {
  return (long long)std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

}  // namespace

std::exception_ptr P2pEngine::Impl::opError(const P2pOp& op, const std::string& why, bool dead) const {
  std::string msg = detail::str("tunedist: ", describe(op), " failed: ", withoutPrefix(why));
  return dead ? errorOf<PeerDeadError>(msg) : errorOf<Error>(msg);
}

std::exception_ptr P2pEngine::Impl::timeoutError(const P2pOp& op, const std::string& why) const {
  return errorOf<TimeoutError>(detail::str("tunedist: ", describe(op), " timed out after ",
                                           msBetween(op.posted, op.deadline), " ms: ", why));
}

std::string P2pEngine::Impl::receiveStall(const P2pOp& op) const {
  if (op.peer < 0) {
    return detail::str("no message with tag ", op.tag, " arrived from any rank");
  }
  const InChannel& ch = in_[size_t(op.peer)];
  if (ch.ring == nullptr && !ch.staleName.empty()) {
    return detail::str("rank ", op.peer, " announced a channel (", ch.staleName,
                       ") that no longer exists: it destroyed its process group before this rank received");
  }
  if (ch.ring == nullptr) {
    return detail::str("rank ", op.peer, " has sent nothing to this rank yet. Check that it calls the matching send");
  }
  return detail::str("no message with tag ", op.tag, " came from rank ", op.peer, " (", ch.nextSeq - 1,
                     " messages received from it so far). Check the matching send's tag and order");
}

void P2pEngine::Impl::checkDeadlines(Clock::time_point now) {
  for (size_t dst = 0; dst < out_.size(); ++dst) {
    OutChannel& ch = out_[dst];
    for (auto it = ch.queue.begin(); it != ch.queue.end(); ++it) {
      if ((*it)->deadline > now) {
        continue;
      }
      OpPtr op = std::move(*it);
      ch.queue.erase(it);
      bool attached = ch.ring != nullptr && ch.ring->header().receiverAttached.load(std::memory_order_acquire);
      std::string why = attached ? detail::str("rank ", dst, " does not receive fast enough to make room (",
                                               op->written, " of ", p2pMessageSpan(op->bytes),
                                               " bytes written). Check that it posts the matching receive")
                                 : detail::str("rank ", dst, " has not started receiving from this rank. Check that "
                                               "it calls the matching receive");
      std::exception_ptr error = timeoutError(*op, why);
      std::string broken = detail::str("an earlier send to rank ", dst, " (tag ", op->tag, ") timed out, so ",
                                       "the order of messages to it can no longer be kept");
      fail(std::move(op), std::move(error));
      failOutChannel(int(dst), ch, broken, false);
      break;
    }
  }
  for (auto it = posted_.begin(); it != posted_.end();) {
    if ((*it)->deadline > now) {
      ++it;
      continue;
    }
    OpPtr op = std::move(*it);
    it = posted_.erase(it);
    std::exception_ptr error = timeoutError(*op, receiveStall(*op));
    fail(std::move(op), std::move(error));
  }
  for (size_t src = 0; src < in_.size(); ++src) {
    InChannel& ch = in_[src];
    if (ch.receive != nullptr && ch.receive->deadline <= now) {
      OpPtr op = std::move(ch.receive);
      ch.dest = InChannel::Dest::kDiscard;  // the rest of the message is drained and dropped
      std::exception_ptr error = timeoutError(
          *op, detail::str("the message from rank ", src, " stopped arriving after ", ch.consumed, " of ",
                           op->bytes, " bytes"));
      fail(std::move(op), std::move(error));
    }
  }
  for (Unexpected& u : unexpected_) {
    if (u.claimedBy != nullptr && u.claimedBy->deadline <= now) {
      OpPtr op = std::move(u.claimedBy);
      std::exception_ptr error =
          timeoutError(*op, detail::str("the matching message from rank ", u.src, " stopped arriving"));
      fail(std::move(op), std::move(error));
    }
  }
}

void P2pEngine::Impl::checkPeers(Clock::time_point now) {
  std::string reason;
  for (size_t dst = 0; dst < out_.size(); ++dst) {
    OutChannel& ch = out_[dst];
    if (ch.ring == nullptr || ch.queue.empty() || !ch.failure.empty()) {
      continue;
    }
    P2pRing::PeerState state = ch.ring->peerState(now, options_.deadAfter, &reason);
    if (state == P2pRing::PeerState::kClosed || state == P2pRing::PeerState::kDead) {
      failOutChannel(int(dst), ch, detail::str("rank ", dst, " ", reason), true);
    }
  }
  for (size_t src = 0; src < in_.size(); ++src) {
    InChannel& ch = in_[src];
    if (ch.ring == nullptr || !ch.failure.empty() || !(ch.inMessage || want_[src])) {
      continue;
    }
    if (ch.ring->header().head.load(std::memory_order_acquire) != ch.tail) {
      continue;  // deliver what the peer wrote before judging it
    }
    P2pRing::PeerState state = ch.ring->peerState(now, options_.deadAfter, &reason);
    if (state == P2pRing::PeerState::kClosed || state == P2pRing::PeerState::kDead) {
      failInChannel(int(src), ch, detail::str("rank ", src, " ", reason), true,
                    state == P2pRing::PeerState::kDead);
    }
  }
}

void P2pEngine::Impl::failInChannel(int src, InChannel& ch, const std::string& why, bool dead, bool anySourceToo) {
  ch.failure = why;
  ch.failureIsDead = dead;
  ch.failureFailsAnySource = anySourceToo;
  if (ch.inMessage) {
    if (ch.dest == InChannel::Dest::kReceive) {
      OpPtr op = std::move(ch.receive);
      std::exception_ptr error = opError(*op, why, dead);
      fail(std::move(op), std::move(error));
    } else if (ch.dest == InChannel::Dest::kUnexpected) {
      if (ch.unexpected->claimedBy != nullptr) {
        OpPtr op = std::move(ch.unexpected->claimedBy);
        std::exception_ptr error = opError(*op, why, dead);
        fail(std::move(op), std::move(error));
      }
      unexpected_.erase(ch.unexpected);
    }
    ch.inMessage = false;
    ch.dest = InChannel::Dest::kDiscard;
  }
  for (auto it = posted_.begin(); it != posted_.end();) {
    if ((*it)->peer == src || (anySourceToo && (*it)->peer < 0)) {
      OpPtr op = std::move(*it);
      it = posted_.erase(it);
      std::exception_ptr error = opError(*op, why, dead);
      fail(std::move(op), std::move(error));
    } else {
      ++it;
    }
  }
}

void P2pEngine::Impl::failOutChannel(int dst, OutChannel& ch, const std::string& why, bool dead) {
  ch.failure = why;
  ch.failureIsDead = dead;
  while (!ch.queue.empty()) {
    OpPtr op = std::move(ch.queue.front());
    ch.queue.pop_front();
    std::exception_ptr error = opError(*op, why, dead);
    fail(std::move(op), std::move(error));
  }
  if (ch.ring != nullptr) {
    // A half-written message can never be finished: let the receiver fail instead of waiting for the rest.
    ch.ring->markClosed();
  }
}

void P2pEngine::Impl::failAll(const std::string& reason) {
  for (size_t dst = 0; dst < out_.size(); ++dst) {
    OutChannel& ch = out_[dst];
    if (ch.failure.empty()) {
      failOutChannel(int(dst), ch, reason, false);
    }
  }
  for (size_t src = 0; src < in_.size(); ++src) {
    InChannel& ch = in_[src];
    if (ch.failure.empty()) {
      failInChannel(int(src), ch, reason, false, true);
    }
    if (ch.ring != nullptr) {
      ch.ring->markClosed();
    }
  }
  for (auto it = posted_.begin(); it != posted_.end(); it = posted_.erase(it)) {
    OpPtr op = std::move(*it);
    std::exception_ptr error = opError(*op, reason, false);
    fail(std::move(op), std::move(error));
  }
  for (Unexpected& u : unexpected_) {
    if (u.claimedBy != nullptr) {
      OpPtr op = std::move(u.claimedBy);
      std::exception_ptr error = opError(*op, reason, false);
      fail(std::move(op), std::move(error));
    }
  }
}

}  // namespace tunedist::shm
