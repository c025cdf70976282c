#include "shm/p2p/send_channel.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/store_keys.h"

namespace tunedist::shm::p2p {

void SendChannel::post(OpPtr op) {
  if (!failure_.empty()) {
    std::exception_ptr error = channelError(*op, ctx_.rank, failure_, failureIsDead_);
    p2p::fail(std::move(op), std::move(error));
    return;
  }
  queue_.push_back(std::move(op));
}

bool SendChannel::createRing() {
  try {
    ring_ = P2pRing::create(ctx_.rank, dst_, ctx_.options.p2pChannelBytes, ctx_.options.shmDir,
                            ctx_.options.sweepMinAge, [this](core::LifeLock* l) { ctx_.heartbeat->hold(l); });
    // Step 1: announce the ring; the receiver maps it when it first wants our messages.
    ctx_.rendezvous->set(core::keys::p2pRing(ctx_.rank, dst_), ring_->name());
  } catch (const std::exception& e) {
    // Fail the send that needed it; the next one tries again. A ring whose life lock our heartbeat thread already
    // holds stays mapped until the channel goes (after that thread), so the thread never touches unmapped memory.
    if (ring_ != nullptr) {
      abandoned_.push_back(std::move(ring_));
    }
    OpPtr op = std::move(queue_.front());
    queue_.pop_front();
    std::string msg = core::detail::str("tunedist: ", describe(*op, ctx_.rank), " failed: ", e.what());
    p2p::fail(std::move(op), errorOf<core::Error>(msg));
    return false;
  }
  ctx_.heartbeat->add(*ring_);
  return true;
}

bool SendChannel::pump() {
  if (ring_ == nullptr && !createRing()) {
    return true;
  }
  bool moved = takeReport();
  if (ring_->header().receiverClosed.load(std::memory_order_acquire) != 0) {
    fail(core::detail::str("rank ", dst_,
                           " closed its point-to-point channel (its process group was destroyed or "
                           "aborted)"),
         true);
    return true;
  }
  uint64_t budget = ring_->capacity();
  while (!queue_.empty() && budget > 0) {
    if (queue_.front()->written == 0 && !peerError_.empty()) {
      rejectFront();
      moved = true;
      continue;
    }
    uint64_t step = writeFront(&budget);
    if (step == 0) {
      break;
    }
    head_ += step;
    // Step 2: publish the header and/or payload piece (release); the receiver may read up to head.
    ring_->publishCursor(head_);
    moved = true;
    if (queue_.front()->written == p2pMessageSpan(queue_.front()->bytes)) {
      // Step 3: all of it is in the ring.
      OpPtr done = std::move(queue_.front());
      queue_.pop_front();
      complete(std::move(done), dst_);
    }
  }
  return moved;
}

bool SendChannel::takeReport() {
  P2pRingHeader& h = ring_->header();
  // Acquire: the report's text is complete. The next send that starts carries it back to the caller.
  if (h.errorState.load(std::memory_order_acquire) != uint32_t(P2pErrorState::kPosted)) {
    return false;
  }
  peerError_.assign(h.errorText, strnlen(h.errorText, kP2pErrorBytes));
  h.errorState.store(uint32_t(P2pErrorState::kEmpty), std::memory_order_release);
  return true;
}

void SendChannel::rejectFront() {
  OpPtr op = std::move(queue_.front());
  queue_.pop_front();
  std::string msg = core::detail::str("tunedist: ", describe(*op, ctx_.rank), " failed: rank ", dst_,
                                      " rejected an earlier message from this rank: ", peerError_);
  peerError_.clear();
  p2p::fail(std::move(op), errorOf<core::Error>(msg));
}

// Writes as much of the first queued send as the ring and `budget` allow (the header first, when it starts).
// Returns the bytes written, to be published.
uint64_t SendChannel::writeFront(uint64_t* budget) {
  Op& op = *queue_.front();
  // Acquire: the receiver is done with the bytes before tail.
  uint64_t free = ring_->capacity() - (head_ - ring_->header().tail.load(std::memory_order_acquire));
  uint64_t step = 0;
  if (op.written == 0) {
    if (free < kCacheLine) {
      return 0;
    }
    P2pMsgHeader m{};
    m.magic = kP2pMsgMagic;
    m.seq = nextSeq_++;
    m.bytes = op.bytes;
    m.tag = op.tag;
    ring_->write(head_, &m, sizeof(m));
    step = kCacheLine;
    op.written = kCacheLine;
  }
  const uint64_t span = p2pMessageSpan(op.bytes);
  uint64_t n = std::min({free - step, span - op.written, uint64_t(ctx_.chunkBytes), *budget});
  if (n > 0) {
    // Payload offset of this piece; the padding after the payload is counted but not written.
    uint64_t off = op.written - kCacheLine;
    size_t dataBytes = off < op.bytes ? size_t(std::min<uint64_t>(n, op.bytes - off)) : 0;
    ring_->write(head_ + step, op.data + off, dataBytes);
    op.written += n;
    step += n;
    *budget -= n;
  }
  return step;
}

void SendChannel::expire(Clock::time_point now) {
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if ((*it)->deadline > now) {
      continue;
    }
    OpPtr op = std::move(*it);
    queue_.erase(it);
    bool attached = ring_ != nullptr && ring_->header().receiverAttached.load(std::memory_order_acquire);
    std::string why = attached ? core::detail::str("rank ", dst_, " does not receive fast enough to make room (",
                                                   op->written, " of ", p2pMessageSpan(op->bytes),
                                                   " bytes written). Check that it posts the matching receive")
                               : core::detail::str("rank ", dst_,
                                                   " has not started receiving from this rank. Check that "
                                                   "it calls the matching receive");
    std::exception_ptr error = timeoutError(*op, ctx_.rank, why);
    std::string broken = core::detail::str("after the timeout of an earlier send to rank ", dst_, " (tag ", op->tag,
                                           ") the order of messages to it can no longer be kept");
    p2p::fail(std::move(op), std::move(error));
    fail(broken, false);
    return;
  }
}

void SendChannel::checkPeer(Clock::time_point now) {
  if (ring_ == nullptr || queue_.empty() || !failure_.empty()) {
    return;
  }
  std::string reason;
  P2pRing::PeerState state = ring_->peerState(now, ctx_.options.deadAfter, &reason);
  int32_t pid = 0;
  if (state == P2pRing::PeerState::kUnknown && ctx_.peers->certainlyGone(dst_, &pid)) {
    // The receiver never mapped the ring and its process is gone: nothing will ever read what waits here.
    state = P2pRing::PeerState::kDead;
    reason = core::detail::str("is dead: its process (pid ", pid,
                               ") has exited before it received anything from "
                               "this rank");
  }
  if (state == P2pRing::PeerState::kClosed || state == P2pRing::PeerState::kDead) {
    fail(core::detail::str("rank ", dst_, " ", reason), true);
  }
}

void SendChannel::fail(const std::string& why, bool dead) {
  failure_ = why;
  failureIsDead_ = dead;
  while (!queue_.empty()) {
    OpPtr op = std::move(queue_.front());
    queue_.pop_front();
    std::exception_ptr error = opError(*op, ctx_.rank, why, dead);
    p2p::fail(std::move(op), std::move(error));
  }
  if (ring_ != nullptr) {
    // A half-written message can never be finished: let the receiver fail instead of waiting for the rest.
    ring_->markClosed();
  }
}

bool SendChannel::canWrite() const {
  if (ring_ == nullptr || queue_.empty()) {
    return false;
  }
  uint64_t used = head_ - ring_->header().tail.load(std::memory_order_seq_cst);
  uint64_t free = ring_->capacity() - used;
  return free >= (queue_.front()->written == 0 ? kCacheLine : 1);
}

bool SendChannel::watch(BellSet& bells) const {
  if (ring_ == nullptr || queue_.empty()) {
    return false;
  }
  bells.add(*ring_);
  const P2pRingHeader& h = ring_->header();
  return canWrite() || h.errorState.load(std::memory_order_seq_cst) != 0 ||
         h.receiverClosed.load(std::memory_order_seq_cst) != 0;
}

Clock::time_point SendChannel::earliestDeadline() const {
  Clock::time_point t = Clock::time_point::max();
  for (const OpPtr& op : queue_) {
    t = std::min(t, op->deadline);
  }
  return t;
}

bool SendChannel::receiverAbsent() const {
  const P2pRingHeader& h = ring_->header();
  return h.receiverAttached.load(std::memory_order_acquire) == 0 &&
         h.receiverClosed.load(std::memory_order_acquire) == 0;
}

}  // namespace tunedist::shm::p2p
