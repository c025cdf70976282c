// P2pEngine's receives: matching, the unexpected queue, reading messages out of the rings, and finding rings.
//
// A receive (src -> us):
//   1. Look in the unexpected queue first (messages that arrived before anybody wanted them).
//   2. Otherwise post it. The first receive that wants src polls the rendezvous for src's ring; once found we map
//      it and unlink its name.
//   3. For each ring somebody here waits on: read the next message header and match it against the posted
//      receives in posting order (same source or any source, same tag). Matched: stream the payload into that
//      receive's buffer. Not matched: stream it into a heap buffer in the unexpected queue, so later messages of
//      other tags can flow. A message whose size differs from the receive fails that receive (and is dropped);
//      the sender hears of it through the ring's error report.
//   4. Nobody here wants src's messages at all: leave them in the ring, so the sender is flow-controlled.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "shm/p2p/impl.h"

namespace tunedist::shm {
namespace {

// Rendezvous polls for a ring not found yet: first at once, then ever less often up to kMaxPoll.
constexpr std::chrono::microseconds kFirstPoll{500};
constexpr std::chrono::microseconds kMaxPoll{20000};
constexpr std::chrono::milliseconds kAnnounceGetTimeout{10000};
constexpr int kMaxPollsPerPass = 4;

}  // namespace

void P2pEngine::Impl::postReceive(OpPtr op) {
  if (takeUnexpected(op)) {
    return;
  }
  for (size_t src = 0; src < in_.size(); ++src) {
    InChannel& ch = in_[src];
    bool relevant = op->peer == int(src) || (op->peer < 0 && int(src) != rank_);
    if (!relevant) {
      continue;
    }
    if (!ch.failure.empty() && (op->peer >= 0 || ch.failureFailsAnySource)) {
      std::string msg = detail::str("tunedist: ", describe(*op), " failed: ", ch.failure);
      fail(std::move(op), ch.failureIsDead ? errorOf<PeerDeadError>(msg) : errorOf<Error>(msg));
      return;
    }
    // A new receive looks for a missing ring at once (discover() backs off again while nothing comes).
    ch.pollInterval = std::chrono::microseconds(0);
    ch.nextPoll = Clock::time_point{};
  }
  posted_.push_back(std::move(op));
}

bool P2pEngine::Impl::takeUnexpected(OpPtr& op) {
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    Unexpected& u = *it;
    if (u.dropped || u.claimedBy != nullptr || u.tag != op->tag || (op->peer >= 0 && op->peer != u.src)) {
      continue;
    }
    if (u.bytes != op->bytes) {
      std::string msg = sizeMismatch(*op, u.src, u.tag, u.bytes);
      reportToSender(in_[size_t(u.src)], msg);
      if (u.complete) {
        unexpected_.erase(it);
      } else {
        u.dropped = true;  // its channel keeps consuming the rest and then erases it
        u.data.reset();
      }
      fail(std::move(op), errorOf<Error>(msg));
      return true;
    }
    if (!u.complete) {
      u.claimedBy = std::move(op);
      return true;
    }
    if (u.bytes > 0) {
      std::memcpy(op->data, u.data.get(), u.bytes);
    }
    int src = u.src;
    unexpected_.erase(it);
    complete(std::move(op), src);
    return true;
  }
  return false;
}

std::string P2pEngine::Impl::sizeMismatch(const P2pOp& op, int src, int64_t tag, size_t sentBytes) const {
  return detail::str("tunedist: recv on rank ", rank_, " from rank ", src, op.peer < 0 ? " (any-source receive)" : "",
                     " (tag ", tag, "): size mismatch: rank ", src, " sent ", sentBytes,
                     " bytes but the receive expects ", op.bytes,
                     " bytes; the message was dropped. A send and its matching receive must use tensors of the "
                     "same size (numel x element size).");
}

void P2pEngine::Impl::reportToSender(InChannel& ch, const std::string& text) {
  if (ch.ring == nullptr) {
    return;
  }
  P2pRingHeader& h = ch.ring->header();
  uint32_t expected = uint32_t(P2pErrorState::kEmpty);
  // One report at a time: while the sender has not taken the previous one, it already has an error to raise.
  if (!h.errorState.compare_exchange_strong(expected, uint32_t(P2pErrorState::kWriting),
                                            std::memory_order_acquire)) {
    return;
  }
  size_t n = std::min(text.size(), kP2pErrorBytes - 1);
  std::memcpy(h.errorText, text.data(), n);
  h.errorText[n] = '\0';
  // Release: the sender that sees kPosted sees the whole text.
  h.errorState.store(uint32_t(P2pErrorState::kPosted), std::memory_order_seq_cst);
  ch.ring->notify();
}

bool P2pEngine::Impl::pumpReceives() {
  bool moved = false;
  for (size_t src = 0; src < in_.size(); ++src) {
    InChannel& ch = in_[src];
    if (ch.ring != nullptr && ch.failure.empty() && (ch.inMessage || want_[src])) {
      moved = pumpReceive(int(src), ch) || moved;
    }
  }
  return moved;
}

bool P2pEngine::Impl::pumpReceive(int src, InChannel& ch) {
  P2pRing& ring = *ch.ring;
  bool moved = false;
  uint64_t budget = ring.capacity();
  while (budget > 0 && ch.failure.empty()) {
    // Acquire: the bytes before head are written.
    uint64_t head = ring.header().head.load(std::memory_order_acquire);
    uint64_t before = ch.tail;
    if (!ch.inMessage && (head - ch.tail < kCacheLine || !startMessage(src, ch))) {
      break;
    }
    const uint64_t span = roundUp(ch.message.bytes, kCacheLine);
    uint64_t n = std::min({head - ch.tail, span - ch.consumed, uint64_t(chunkBytes_), budget});
    if (n > 0) {
      char* dest = nullptr;
      if (ch.dest == InChannel::Dest::kReceive) {
        dest = ch.receive->data;
      } else if (ch.dest == InChannel::Dest::kUnexpected && !ch.unexpected->dropped) {
        dest = ch.unexpected->data.get();
      }
      uint64_t off = ch.consumed;
      if (dest != nullptr && off < ch.message.bytes) {
        ring.read(ch.tail, dest + off, size_t(std::min<uint64_t>(n, ch.message.bytes - off)));
      }
      ch.tail += n;
      ch.consumed += n;
      budget -= n;
    }
    if (ch.tail != before) {
      // Release: we are done with the bytes before tail; the sender may overwrite them.
      ring.publishCursor(ch.tail);
      moved = true;
    }
    if (ch.consumed == span) {
      finishMessage(src, ch);
      moved = true;
    } else if (n == 0) {
      break;
    }
  }
  return moved;
}

bool P2pEngine::Impl::startMessage(int src, InChannel& ch) {
  P2pMsgHeader m{};
  ch.ring->read(ch.tail, &m, sizeof(m));
  if (m.magic != kP2pMsgMagic || m.seq != ch.nextSeq) {
    failInChannel(src, ch, detail::str("protocol error on the channel from rank ", src, ": message ", ch.nextSeq,
                                       " has magic ", std::hex, m.magic, std::dec, " and sequence ", m.seq,
                                       " (memory corruption, or ranks running different tunedist builds)"),
                  false, false);
    return false;
  }
  auto match = posted_.end();
  bool wanted = false;
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if ((*it)->peer == src || (*it)->peer < 0) {
      wanted = true;
      if ((*it)->tag == m.tag) {
        match = it;
        break;
      }
    }
  }
  if (!wanted) {
    return false;  // Step 4: leave it in the ring.
  }
  ch.message = m;
  ch.inMessage = true;
  ch.consumed = 0;
  ch.tail += kCacheLine;
  ++ch.nextSeq;
  if (match == posted_.end()) {
    // Step 3, not matched: buffer it so messages behind it can reach their receives.
    Unexpected& u = unexpected_.emplace_back();
    u.src = src;
    u.tag = m.tag;
    u.bytes = size_t(m.bytes);
    u.data.reset(new char[std::max<size_t>(u.bytes, 1)]);
    ch.dest = InChannel::Dest::kUnexpected;
    ch.unexpected = std::prev(unexpected_.end());
    return true;
  }
  OpPtr op = std::move(*match);
  posted_.erase(match);
  if (op->bytes != m.bytes) {
    std::string msg = sizeMismatch(*op, src, m.tag, size_t(m.bytes));
    reportToSender(ch, msg);
    ch.dest = InChannel::Dest::kDiscard;
    fail(std::move(op), errorOf<Error>(msg));
    return true;
  }
  ch.dest = InChannel::Dest::kReceive;
  ch.receive = std::move(op);
  return true;
}

void P2pEngine::Impl::finishMessage(int src, InChannel& ch) {
  ch.inMessage = false;
  if (ch.dest == InChannel::Dest::kReceive) {
    complete(std::move(ch.receive), src);
  } else if (ch.dest == InChannel::Dest::kUnexpected) {
    Unexpected& u = *ch.unexpected;
    u.complete = true;
    if (u.dropped) {
      unexpected_.erase(ch.unexpected);
    } else if (u.claimedBy != nullptr) {
      OpPtr op = std::move(u.claimedBy);
      if (u.bytes > 0) {
        std::memcpy(op->data, u.data.get(), u.bytes);
      }
      unexpected_.erase(ch.unexpected);
      complete(std::move(op), src);
    }
  }
  ch.dest = InChannel::Dest::kDiscard;
}

bool P2pEngine::Impl::discover(Clock::time_point now) {
  bool moved = false;
  int polls = 0;
  // Round-robin from where the last pass stopped: each poll is a store round trip (c10d's TCPStore), so a pass
  // makes only a few and the rings already found keep flowing.
  for (size_t i = 0; i < in_.size() && polls < kMaxPollsPerPass; ++i) {
    const size_t s = (discoverCursor_ + i) % in_.size();
    InChannel& ch = in_[s];
    if (ch.ring != nullptr || !ch.failure.empty() || !want_[s] || now < ch.nextPoll) {
      continue;
    }
    ++polls;
    discoverCursor_ = s + 1;
    ch.pollInterval = std::clamp(ch.pollInterval * 2, kFirstPoll, kMaxPoll);
    ch.nextPoll = now + ch.pollInterval;
    const int src = int(s);
    try {
      std::string key = p2pRingKey(src, rank_);
      if (!rendezvous_->check(key)) {
        continue;
      }
      std::string name = rendezvous_->get(key, kAnnounceGetTimeout);
      ch.ring = P2pRing::open(name, src, rank_, options_.p2pChannelBytes);
      if (ch.ring == nullptr) {
        // Gone already: the sender was destroyed before we came (its messages are lost), or a stale announcement
        // that a fresh one may still replace. Give it deadAfter, as for a silent heartbeat.
        if (ch.staleName != name) {
          ch.staleName = name;
          ch.staleSince = now;
        } else if (now - ch.staleSince > options_.deadAfter) {
          failInChannel(src, ch, detail::str("rank ", src, " closed its point-to-point channel to this rank (",
                                             name, ") before this rank attached to it: its process group was "
                                             "destroyed, and messages it sent and this rank did not receive are "
                                             "lost"), true, false);
          moved = true;
        }
        continue;
      }
    } catch (const std::exception& e) {
      failInChannel(src, ch, e.what(), false, true);
      moved = true;
      continue;
    }
    addBeat(*ch.ring);
    moved = true;
  }
  return moved;
}

}  // namespace tunedist::shm
