// The typed layout of one point-to-point ring: the shared-memory segment that carries messages from one rank (the
// sender) to another (the receiver). One segment per ordered pair, created by the sender at the pair's first send.
//
//   [P2pRingHeader, rounded to 4 KiB] [data: dataBytes, a circular byte buffer]
//
// Ownership: the sender writes the data region and its own cache line (head, heartbeat, identity, closed); the
// receiver writes its own line (tail, heartbeat, identity, attached, closed) and the error report. `head` and
// `tail` are monotonic byte counts; the data written but not yet consumed is [tail, head) modulo dataBytes.
//
// A message is a 64-byte P2pMsgHeader followed by its payload, padded to 64 bytes. dataBytes is a multiple of 64,
// so a header never wraps; a payload may wrap and may be larger than the ring (it streams through in pieces).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "shm/layout.h"

namespace tunedist::shm::p2p {

constexpr uint64_t kP2pRingMagic = 0x676e69725f703270ULL;  // "p2p_ring" little-endian
constexpr uint32_t kP2pVersion = 2;
constexpr uint64_t kP2pMsgMagic = 0x67736d5f703270ULL;  // "p2p_msg"
constexpr size_t kP2pErrorBytes = 1024;

// The receiver's report of a failed message back to the sender (a size mismatch), as a one-slot mailbox.
enum class P2pErrorState : uint32_t {
  kEmpty = 0,    // the receiver may post a report
  kWriting = 1,  // the receiver is writing the text
  kPosted = 2,   // the text is complete; the sender takes it and sets kEmpty
};

struct alignas(kCacheLine) P2pRingHeader {
  // Line 0: written by the sender before it publishes the segment's name; read-only afterwards.
  uint64_t magic;
  uint64_t buildId;
  uint32_t version;
  int32_t srcRank;
  int32_t dstRank;
  uint32_t reserved0;
  uint64_t dataBytes;
  uint64_t dataOffset;

  // Line 1: the sender's. head = bytes written so far (release: the data before it is complete).
  alignas(kCacheLine) std::atomic<uint64_t> head;
  std::atomic<uint64_t> senderBeat;    // moves every heartbeat period while the sender lives
  std::atomic<uint32_t> senderClosed;  // 1: the sender's engine is gone or aborted; no more bytes will come
  int32_t senderPid;
  uint64_t senderPidNamespace;
  uint64_t senderStartTime;

  // Line 2: the receiver's. tail = bytes consumed so far (release: the sender may overwrite bytes before it).
  alignas(kCacheLine) std::atomic<uint64_t> tail;
  std::atomic<uint64_t> receiverBeat;
  std::atomic<uint32_t> receiverAttached;  // 1 once the receiver mapped the ring (release: its identity is set)
  std::atomic<uint32_t> receiverClosed;    // 1: the receiver's engine is gone or aborted; nothing will be read
  int32_t receiverPid;
  uint32_t reserved1;
  uint64_t receiverPidNamespace;
  uint64_t receiverStartTime;

  // Line 3: the futex both sides sleep on. Whoever moves head, tail, an error or a closed flag bumps it and wakes
  // the sleepers when `sleepers` is non-zero (the Dekker pattern of round.cpp, hence seq_cst on both sides).
  alignas(kCacheLine) std::atomic<uint32_t> bell;
  std::atomic<uint32_t> sleepers;

  // Lines 4+: the receiver's error report (P2pErrorState; release on kPosted makes the text visible).
  alignas(kCacheLine) std::atomic<uint32_t> errorState;
  char errorText[kP2pErrorBytes];

  // The life locks (core/sync.h), each on a line of its own: held by the sender's (receiver's) heartbeat thread from
  // before the ring is announced (before receiverAttached is set) until that process leaves, so each side learns of
  // the other's death exactly, while a stopped process still holds its lock.
  alignas(kCacheLine) core::LifeLock senderLife;
  alignas(kCacheLine) core::LifeLock receiverLife;
};
static_assert(offsetof(P2pRingHeader, head) == 1 * kCacheLine, "head must start the sender's cache line");
static_assert(offsetof(P2pRingHeader, tail) == 2 * kCacheLine, "tail must start the receiver's cache line");
static_assert(offsetof(P2pRingHeader, bell) == 3 * kCacheLine, "bell must sit on its own cache line");
static_assert(offsetof(P2pRingHeader, errorState) == 4 * kCacheLine, "the error report must start a cache line");
static_assert(sizeof(P2pRingHeader) % kCacheLine == 0 && sizeof(P2pRingHeader) <= kPage,
              "P2pRingHeader must be whole cache lines within one page");
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "cross-process atomics must be lock-free");

// The header of one message in the ring; the payload follows it.
struct alignas(kCacheLine) P2pMsgHeader {
  uint64_t magic;  // kP2pMsgMagic: a torn or misaligned read shows up as a protocol error, not as garbage data
  uint64_t seq;    // 1, 2, 3, ... per ring
  uint64_t bytes;  // payload bytes (0 allowed)
  int64_t tag;
  uint8_t reserved[32];
};
static_assert(sizeof(P2pMsgHeader) == kCacheLine, "a message header is exactly one cache line");

// Bytes a message of `payload` bytes occupies in the ring: header plus payload padded to a cache line.
inline uint64_t p2pMessageSpan(uint64_t payload) { return kCacheLine + roundUp(payload, kCacheLine); }

// Where the data region starts, and the whole segment's size, for a ring of `dataBytes`.
inline size_t p2pDataOffset() { return roundUp(sizeof(P2pRingHeader), kPage); }
inline size_t p2pSegmentBytes(size_t dataBytes) { return p2pDataOffset() + dataBytes; }

}  // namespace tunedist::shm::p2p
