// P2pRing: this process's view of one point-to-point ring (see layout.h), as the sender or the receiver.
// It owns the mapping (ShmSegment) and knows how to copy bytes in and out of the circular data region, how to wake
// the peer, and whether the peer is still there. It keeps no protocol state beyond that: the channel that owns it
// does (send_channel.h, recv_channel.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shm/p2p/layout.h"
#include "shm/segment.h"

namespace tunedist::shm::p2p {

class P2pRing {
 public:
  using Clock = std::chrono::steady_clock;

  // Makes a long-lived thread of this process hold `lock` (heartbeat.h Heartbeat::hold); returns once held.
  using HoldLife = std::function<void(core::LifeLock* lock)>;

  // Sender: creates and initialises a ring for src -> dst with `dataBytes` of data, stamped with our identity and
  // with our life lock held (`hold`).
  static std::unique_ptr<P2pRing> create(int src, int dst, size_t dataBytes, const char* shmDir,
                                         std::chrono::seconds sweepMinAge, const HoldLife& hold);
  // Receiver: maps the ring `name` announced by src, checks it, stamps our identity, marks us attached and
  // unlinks the name (both sides have it mapped now, so nothing can leak). Returns null when the name does not
  // exist (a stale announcement or a sender that is already gone).
  // Our life lock is held (`hold`) before we are marked attached.
  static std::unique_ptr<P2pRing> open(const std::string& name, int src, int dst, size_t dataBytes,
                                       const HoldLife& hold);

  P2pRing(const P2pRing&) = delete;
  P2pRing& operator=(const P2pRing&) = delete;

  P2pRingHeader& header() const { return *header_; }
  const std::string& name() const { return segment_.name(); }
  uint64_t capacity() const { return capacity_; }
  bool isSender() const { return isSender_; }

  // Copies `n` bytes between the data region at ring position `pos` (a byte count, taken modulo the capacity)
  // and `buf`, in two pieces when the range wraps. Null `buf` with write() leaves the bytes as they are (padding).
  void write(uint64_t pos, const void* buf, size_t n);
  void read(uint64_t pos, void* buf, size_t n) const;

  // Publishes our cursor (head for the sender, tail for the receiver) and wakes a sleeping peer.
  void publishCursor(uint64_t value);
  // Wakes whoever sleeps on the bell, if anybody does. Call after any store the peer may be waiting for.
  void notify();

  // Our heartbeat counter and closed flag in this ring.
  std::atomic<uint64_t>& ownBeat() const;
  void markClosed();

  // The peer's state as seen from our side: closed, dead (its life lock is free, or its process is gone; the
  // heartbeat, silent for deadAfter, only where the lock cannot tell), or unknown (a receiver that has not attached
  // yet). A stopped peer is alive. `reason` says which, for error messages.
  enum class PeerState { kAlive, kUnknown, kClosed, kDead };
  PeerState peerState(Clock::time_point now, std::chrono::milliseconds deadAfter, std::string* reason);

 private:
  P2pRing(ShmSegment segment, bool isSender);
  void startLiveness();

  ShmSegment segment_;
  P2pRingHeader* header_ = nullptr;
  char* data_ = nullptr;
  uint64_t capacity_ = 0;
  bool isSender_ = false;
  // Liveness bookkeeping of the peer's heartbeat (engine thread only).
  bool beatSeen_ = false;
  uint64_t lastBeat_ = 0;
  Clock::time_point lastBeatChange_;
};

// The futex words one sleep of the engine's progress thread watches: its own bell, and the bell of each ring added.
// Adding a ring registers us as a sleeper on it (the Dekker half of P2pRing::notify()), so the caller adds the
// rings first and then re-checks what their peers may have changed; the destructor unregisters.
class BellSet {
 public:
  explicit BellSet(std::atomic<uint32_t>& ownBell);
  ~BellSet();
  BellSet(const BellSet&) = delete;
  BellSet& operator=(const BellSet&) = delete;

  void add(P2pRing& ring);
  bool hasRings() const { return !rings_.empty(); }
  // Sleeps until a bell rings or `deadline` (see futexWaitAny; `waitvSupported` carries its finding across calls).
  void wait(std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds fallbackSlice,
            bool* waitvSupported) const;

 private:
  std::vector<std::pair<std::atomic<uint32_t>*, uint32_t>> words_;
  std::vector<P2pRing*> rings_;
};

}  // namespace tunedist::shm::p2p
