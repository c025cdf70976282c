#include "shm/p2p/ring.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "core/error.h"
#include "core/sync.h"

namespace tunedist::shm::p2p {

std::unique_ptr<P2pRing> P2pRing::create(int src, int dst, size_t dataBytes, const char* shmDir,
                                         std::chrono::seconds sweepMinAge, const HoldLife& hold) {
  ShmSegment segment = ShmSegment::create("p", p2pSegmentBytes(dataBytes), shmDir, sweepMinAge);
  auto* header = new (segment.data()) P2pRingHeader();
  header->magic = kP2pRingMagic;
  header->buildId = TUNEDIST_BUILD_ID;
  header->version = kP2pVersion;
  header->srcRank = src;
  header->dstRank = dst;
  header->dataBytes = dataBytes;
  header->dataOffset = p2pDataOffset();
  core::ProcessIdentity me = core::ProcessIdentity::self();
  header->senderPid = me.pid;
  header->senderPidNamespace = me.pidNamespace;
  header->senderStartTime = me.startTime;
  // The receiver reads these fields (and probes our life lock) only after it found the name, which we publish after
  // this returns.
  std::unique_ptr<P2pRing> ring(new P2pRing(std::move(segment), true));
  hold(&header->senderLife);
  return ring;
}

std::unique_ptr<P2pRing> P2pRing::open(const std::string& name, int src, int dst, size_t dataBytes,
                                       const HoldLife& hold) {
  bool notFound = false;
  ShmSegment segment = ShmSegment::open(name, p2pSegmentBytes(dataBytes), &notFound);
  if (!segment.valid()) {
    return nullptr;
  }
  auto* header = static_cast<P2pRingHeader*>(segment.data());
  TD_CHECK(header->magic == kP2pRingMagic && header->version == kP2pVersion, "tunedist: p2p channel ", name,
           " from rank ", src, " has magic ", std::hex, header->magic, std::dec, " version ", header->version,
           "; expected version ", kP2pVersion, ": ranks run different tunedist versions");
  TD_CHECK(header->buildId == TUNEDIST_BUILD_ID, "tunedist: rank ", dst, " runs tunedist build ", std::hex,
           TUNEDIST_BUILD_ID, " but rank ", src, " runs build ", header->buildId, std::dec,
           ": install the same build on every rank");
  TD_CHECK(header->srcRank == src && header->dstRank == dst && header->dataBytes == dataBytes &&
               header->dataOffset == p2pDataOffset(),
           "tunedist: p2p channel ", name, " is for ranks ", header->srcRank, " -> ", header->dstRank, " with ",
           header->dataBytes, " data bytes; expected ", src, " -> ", dst, " with ", dataBytes,
           " (ranks disagree on p2pChannelBytes, or two groups share a store prefix)");
  std::unique_ptr<P2pRing> ring(new P2pRing(std::move(segment), false));
  core::ProcessIdentity me = core::ProcessIdentity::self();
  header->receiverPid = me.pid;
  header->receiverPidNamespace = me.pidNamespace;
  header->receiverStartTime = me.startTime;
  hold(&header->receiverLife);
  // Release: a sender that sees attached == 1 sees our identity and our held life lock.
  header->receiverAttached.store(1, std::memory_order_seq_cst);
  ring->notify();
  // Both sides have it mapped: drop the name so a crash of either leaves nothing behind.
  ring->segment_.unlink();
  return ring;
}

P2pRing::P2pRing(ShmSegment segment, bool isSender)
    : segment_(std::move(segment)),
      header_(static_cast<P2pRingHeader*>(segment_.data())),
      data_(static_cast<char*>(segment_.data()) + p2pDataOffset()),
      capacity_(header_->dataBytes),
      isSender_(isSender) {}

void P2pRing::write(uint64_t pos, const void* buf, size_t n) {
  if (buf == nullptr || n == 0) {
    return;
  }
  size_t off = size_t(pos % capacity_);
  size_t first = std::min<size_t>(n, capacity_ - off);
  std::memcpy(data_ + off, buf, first);
  if (first < n) {
    std::memcpy(data_, static_cast<const char*>(buf) + first, n - first);
  }
}

void P2pRing::read(uint64_t pos, void* buf, size_t n) const {
  if (n == 0) {
    return;
  }
  size_t off = size_t(pos % capacity_);
  size_t first = std::min<size_t>(n, capacity_ - off);
  std::memcpy(buf, data_ + off, first);
  if (first < n) {
    std::memcpy(static_cast<char*>(buf) + first, data_, n - first);
  }
}

void P2pRing::publishCursor(uint64_t value) {
  // Release (seq_cst for the sleepers handshake in notify): the bytes before `value` are written (head) or are
  // free to overwrite (tail).
  (isSender_ ? header_->head : header_->tail).store(value, std::memory_order_seq_cst);
  notify();
}

void P2pRing::notify() {
  if (header_->sleepers.load(std::memory_order_seq_cst) > 0) {
    header_->bell.fetch_add(1, std::memory_order_seq_cst);
    core::futexWakeAll(&header_->bell);
  }
}

std::atomic<uint64_t>& P2pRing::ownBeat() const { return isSender_ ? header_->senderBeat : header_->receiverBeat; }

void P2pRing::markClosed() {
  // The peer fails what it waits on from us, once it has drained what we wrote.
  (isSender_ ? header_->senderClosed : header_->receiverClosed).store(1, std::memory_order_seq_cst);
  notify();
}

P2pRing::PeerState P2pRing::peerState(Clock::time_point now, std::chrono::milliseconds deadAfter, std::string* reason) {
  const P2pRingHeader& h = *header_;
  if ((isSender_ ? h.receiverClosed : h.senderClosed).load(std::memory_order_acquire) != 0) {
    *reason = "closed its point-to-point channel (its process group was destroyed or aborted)";
    return PeerState::kClosed;
  }
  if (isSender_ && h.receiverAttached.load(std::memory_order_acquire) == 0) {
    return PeerState::kUnknown;
  }
  uint64_t beat = (isSender_ ? h.receiverBeat : h.senderBeat).load(std::memory_order_acquire);
  if (!beatSeen_ || beat != lastBeat_) {
    beatSeen_ = true;
    lastBeat_ = beat;
    lastBeatChange_ = now;
  }
  core::ProcessIdentity who = isSender_
                                  ? core::ProcessIdentity{h.receiverPid, h.receiverPidNamespace, h.receiverStartTime}
                                  : core::ProcessIdentity{h.senderPid, h.senderPidNamespace, h.senderStartTime};
  const core::Liveness life = core::probeLifeLock(isSender_ ? &header_->receiverLife : &header_->senderLife);
  if (life == core::Liveness::kGone || core::processCertainlyGone(who)) {
    *reason = core::detail::str("is dead: its process (pid ", who.pid, ") has exited");
    return PeerState::kDead;
  }
  if (life == core::Liveness::kAlive) {
    return PeerState::kAlive;  // perhaps stopped, but there: a slow peer, not a dead one
  }
  auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - lastBeatChange_);
  if (silent > deadAfter) {
    *reason = core::detail::str("is dead: its heartbeat (pid ", who.pid, ") stopped ", silent.count(), " ms ago");
    return PeerState::kDead;
  }
  return PeerState::kAlive;
}

BellSet::BellSet(std::atomic<uint32_t>& ownBell) {
  words_.emplace_back(&ownBell, ownBell.load(std::memory_order_seq_cst));
}

BellSet::~BellSet() {
  for (P2pRing* ring : rings_) {
    ring->header().sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void BellSet::add(P2pRing& ring) {
  P2pRingHeader& h = ring.header();
  h.sleepers.fetch_add(1, std::memory_order_seq_cst);
  rings_.push_back(&ring);
  words_.emplace_back(&h.bell, h.bell.load(std::memory_order_seq_cst));
}

void BellSet::wait(std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds fallbackSlice,
                   bool* waitvSupported) const {
  core::futexWaitAny(words_, deadline, fallbackSlice, waitvSupported);
}

}  // namespace tunedist::shm::p2p
