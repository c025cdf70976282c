// One progress pass of P2pEngine (the pass itself, bookkeeping, and sends); receives are in p2p_recv.cpp.
//
// A send (us -> dst), in order per destination:
//   1. The first send to dst creates the ring (ShmSegment::create) and announces its name under
//      tunedist_p2p_<src>_<dst>.
//   2. When 64 bytes are free at head: write the message header. Then copy the payload in chunks as space frees,
//      publishing head (release) after each chunk, so the receiver drains while we fill.
//   3. The send completes when its last byte (plus padding) is in the ring: the caller's buffer is free again.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "shm/p2p/impl.h"

namespace tunedist::shm {
namespace {

constexpr std::chrono::milliseconds kPeerCheckInterval{10};

}  // namespace

std::string P2pEngine::Impl::describe(const P2pOp& op) const {
  if (op.isSend) {
    return detail::str("send to rank ", op.peer, " (tag ", op.tag, ", ", op.bytes, " bytes) on rank ", rank_);
  }
  return detail::str("recv from ", op.peer < 0 ? std::string("any source") : detail::str("rank ", op.peer),
                     " (tag ", op.tag, ", ", op.bytes, " bytes) on rank ", rank_);
}

void P2pEngine::Impl::complete(OpPtr op, int srcRank) {
  Done done = std::move(op->done);
  op.reset();
  try {
    done(nullptr, srcRank);
  } catch (...) {
    // Done must not throw; if it does, the progress thread (every other operation) matters more than its error.
  }
}

void P2pEngine::Impl::fail(OpPtr op, std::exception_ptr error) {
  Done done = std::move(op->done);
  int peer = op->peer;
  op.reset();
  try {
    // Moved, so that no reference stays on this thread once Done handed the error on.
    done(std::move(error), peer);
  } catch (...) {
    // As in complete().
  }
}

bool P2pEngine::Impl::pass(Clock::time_point now) {
  updateWanted();
  bool moved = pumpSends(now);
  moved = pumpReceives() || moved;
  moved = discover(now) || moved;
  checkDeadlines(now);
  if (now >= nextPeerCheck_) {
    nextPeerCheck_ = now + kPeerCheckInterval;
    checkPeers(now);
  }
  return moved;
}

void P2pEngine::Impl::updateWanted() {
  std::fill(want_.begin(), want_.end(), 0);
  for (const OpPtr& op : posted_) {
    if (op->peer >= 0) {
      want_[size_t(op->peer)] = 1;
    } else {
      std::fill(want_.begin(), want_.end(), 1);
      want_[size_t(rank_)] = 0;
      return;
    }
  }
}

bool P2pEngine::Impl::hasPendingWork() const {
  if (!posted_.empty()) {
    return true;
  }
  for (const OutChannel& ch : out_) {
    if (!ch.queue.empty()) {
      return true;
    }
  }
  for (const InChannel& ch : in_) {
    if (ch.inMessage) {
      return true;
    }
  }
  return false;
}

P2pEngine::Clock::time_point P2pEngine::Impl::earliestDeadline() const {
  Clock::time_point t = Clock::time_point::max();
  for (const OutChannel& ch : out_) {
    for (const OpPtr& op : ch.queue) {
      t = std::min(t, op->deadline);
    }
  }
  for (const OpPtr& op : posted_) {
    t = std::min(t, op->deadline);
  }
  for (const InChannel& ch : in_) {
    if (ch.receive != nullptr) {
      t = std::min(t, ch.receive->deadline);
    }
  }
  for (const Unexpected& u : unexpected_) {
    if (u.claimedBy != nullptr) {
      t = std::min(t, u.claimedBy->deadline);
    }
  }
  return t;
}

void P2pEngine::Impl::postSend(OpPtr op) {
  OutChannel& ch = out_[size_t(op->peer)];
  if (!ch.failure.empty()) {
    std::string msg = detail::str("tunedist: ", describe(*op), " failed: ", ch.failure);
    fail(std::move(op), ch.failureIsDead ? errorOf<PeerDeadError>(msg) : errorOf<Error>(msg));
    return;
  }
  ch.queue.push_back(std::move(op));
}

bool P2pEngine::Impl::canWrite(const OutChannel& ch) const {
  if (ch.ring == nullptr || ch.queue.empty()) {
    return false;
  }
  uint64_t used = ch.head - ch.ring->header().tail.load(std::memory_order_seq_cst);
  uint64_t free = ch.ring->capacity() - used;
  return free >= (ch.queue.front()->written == 0 ? kCacheLine : 1);
}

bool P2pEngine::Impl::pumpSends(Clock::time_point now) {
  bool moved = false;
  for (size_t dst = 0; dst < out_.size(); ++dst) {
    if (!out_[dst].queue.empty()) {
      moved = pumpSend(int(dst), out_[dst]) || moved;
    }
  }
  return moved;
}

bool P2pEngine::Impl::createOutRing(int dst, OutChannel& ch) {
  try {
    ch.ring = P2pRing::create(rank_, dst, options_.p2pChannelBytes, options_.shmDir, options_.sweepMinAge);
    // Step 1: announce the ring; the receiver maps it when it first wants our messages.
    rendezvous_->set(p2pRingKey(rank_, dst), ch.ring->name());
  } catch (const std::exception& e) {
    // Fail the send that needed it; the next one tries again.
    ch.ring.reset();
    OpPtr op = std::move(ch.queue.front());
    ch.queue.pop_front();
    std::string msg = detail::str("tunedist: ", describe(*op), " failed: ", e.what());
    fail(std::move(op), errorOf<Error>(msg));
    return false;
  }
  addBeat(*ch.ring);
  return true;
}

bool P2pEngine::Impl::pumpSend(int dst, OutChannel& ch) {
  if (ch.ring == nullptr && !createOutRing(dst, ch)) {
    return true;
  }
  P2pRing& ring = *ch.ring;
  P2pRingHeader& h = ring.header();
  bool moved = false;
  // Acquire: the report's text is complete. The next send that starts carries it back to the caller.
  if (h.errorState.load(std::memory_order_acquire) == uint32_t(P2pErrorState::kPosted)) {
    ch.peerError.assign(h.errorText, strnlen(h.errorText, kP2pErrorBytes));
    h.errorState.store(uint32_t(P2pErrorState::kEmpty), std::memory_order_release);
    moved = true;
  }
  if (h.receiverClosed.load(std::memory_order_acquire) != 0) {
    failOutChannel(dst, ch, detail::str("rank ", dst, " closed its point-to-point channel (its process group was "
                                        "destroyed or aborted)"), true);
    return true;
  }
  uint64_t budget = ring.capacity();
  while (!ch.queue.empty() && budget > 0) {
    P2pOp& op = *ch.queue.front();
    if (op.written == 0 && !ch.peerError.empty()) {
      std::string msg = detail::str("tunedist: ", describe(op), " failed: rank ", dst,
                                    " rejected an earlier message from this rank: ", ch.peerError);
      ch.peerError.clear();
      OpPtr failed = std::move(ch.queue.front());
      ch.queue.pop_front();
      fail(std::move(failed), errorOf<Error>(msg));
      moved = true;
      continue;
    }
    // Acquire: the receiver is done with the bytes before tail.
    uint64_t free = ring.capacity() - (ch.head - h.tail.load(std::memory_order_acquire));
    uint64_t step = 0;
    if (op.written == 0) {
      if (free < kCacheLine) {
        break;
      }
      P2pMsgHeader m{};
      m.magic = kP2pMsgMagic;
      m.seq = ch.nextSeq++;
      m.bytes = op.bytes;
      m.tag = op.tag;
      ring.write(ch.head, &m, sizeof(m));
      step = kCacheLine;
      op.written = kCacheLine;
    }
    const uint64_t span = p2pMessageSpan(op.bytes);
    uint64_t n = std::min({free - step, span - op.written, uint64_t(chunkBytes_), budget});
    if (n > 0) {
      // Payload offset of this piece; the padding after the payload is counted but not written.
      uint64_t off = op.written - kCacheLine;
      size_t dataBytes = off < op.bytes ? size_t(std::min<uint64_t>(n, op.bytes - off)) : 0;
      ring.write(ch.head + step, op.data + off, dataBytes);
      op.written += n;
      step += n;
      budget -= n;
    }
    if (step == 0) {
      break;
    }
    ch.head += step;
    // Step 2: publish the header and/or payload piece (release); the receiver may read up to head.
    ring.publishCursor(ch.head);
    moved = true;
    if (op.written == span) {
      OpPtr done = std::move(ch.queue.front());
      ch.queue.pop_front();
      complete(std::move(done), dst);
    }
  }
  return moved;
}

}  // namespace tunedist::shm
