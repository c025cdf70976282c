// The typed layout of a group's shared-memory segment. Every field that ranks hand to each other is a
// std::atomic with explicit acquire/release, and every cross-rank struct owns whole cache lines.
//
//   [SegmentHeader, 4 KiB] [RankCtl x P] [HeapTable x P, together rounded to 4 KiB]
//   [data: P ranks x kNumBuffers slots x slotBytes]
//
// A rank writes only its own RankCtl, its own HeapTable and its own slots (plus the header's attach counter, bell
// and abort word, and the mappedBy counters of peers' heap chunks); peers read them after observing the owner's
// published step.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/sync.h"

namespace tunedist::shm {

constexpr uint64_t kSegmentMagic = 0x6d68735f64656e75ULL;  // "uned_shm" little-endian, after a 't' that did not fit
constexpr uint32_t kProtocolVersion = 9;
constexpr int kNumBuffers = 2;
constexpr size_t kCacheLine = 64;
constexpr size_t kPage = 4096;
constexpr size_t kAbortReasonBytes = 1024;

// What every rank says it is doing in a given operation; compared across ranks at the first step of each
// operation so that disagreeing ranks all fail with the same clear error instead of exchanging garbage.
//
// probeRequest is not compared: every rank reads every rank's (Rounds::checkDescs). The symmetric fields are not
// compared either: they say where this rank's buffer sits in its symmetric heap (the
// zero-copy collectives, shm/zero_copy/). Ranks run the zero-copy algorithm only when every rank's buffer is symmetric;
// when some are and some are not, every rank sees that in the first round and all restart the operation on the
// copying algorithm (Rounds::run).
struct OpDesc {
  uint64_t seq;          // per-group operation sequence number
  uint64_t count;        // agreed element or byte count (0 where ranks may legitimately differ)
  uint64_t factorBits;   // PREMUL_SUM factor, as the bits of a double
  uint64_t symOffset;    // byte offset of this rank's buffer in heap chunk symChunk (symmetric only)
  uint32_t symChunk;     // index of that chunk in this rank's HeapTable (symmetric only)
  uint32_t opcode;       // tunedist::shm::OpCode
  int32_t root;          // root rank, or -1
  uint8_t dtype;         // tunedist::core::DType
  uint8_t redop;         // tunedist::core::RedOp
  uint8_t valid;         // 1 once written for this operation
  uint8_t symmetric;     // 1: this rank runs the zero-copy algorithm on the buffer at (symChunk, symOffset)
  uint8_t probeRequest;  // 1: this rank asks for a probe window of the operation's stores (shm/round_stores.h)
};
static_assert(sizeof(OpDesc) == 56, "OpDesc layout changed: bump kProtocolVersion");

// SegmentHeader::abortFlag: the aborting rank is writing the reason / the reason is complete.
constexpr uint32_t kAbortWriting = 1;
constexpr uint32_t kAbortSet = 2;

struct alignas(kCacheLine) SegmentHeader {
  uint64_t magic;
  uint64_t buildId;
  uint32_t version;
  uint32_t worldSize;
  uint64_t slotBytes;
  uint64_t totalBytes;
  // Ranks that have mapped the segment; the name is unlinked once it reaches worldSize.
  alignas(kCacheLine) std::atomic<uint32_t> attached;
  // Futex word bumped by a publisher when somebody sleeps; `sleepers` counts them (see sync.h).
  alignas(kCacheLine) std::atomic<uint32_t> bell;
  std::atomic<uint32_t> sleepers;
  // Set once by the first rank that fails; every waiter checks it, so one failure reaches all ranks. 0, then
  // kAbortWriting while that rank fills in the fields below, then kAbortSet.
  alignas(kCacheLine) std::atomic<uint32_t> abortFlag;
  int32_t abortRank;
  int32_t abortKind;  // a FailureKind (error.h): peers throw the same exception type as the aborting rank
  char abortReason[kAbortReasonBytes];
};
static_assert(sizeof(SegmentHeader) <= kPage, "SegmentHeader must fit its page");
static_assert(offsetof(SegmentHeader, attached) % kCacheLine == 0, "attached must start a cache line");
static_assert(offsetof(SegmentHeader, bell) % kCacheLine == 0, "bell must start a cache line");
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "cross-process atomics must be lock-free");

// The operations whose slot stores the group picks together (shm/round_stores.h), and their size classes.
constexpr int kRoundFamilies = 9;
constexpr int kRoundSizeClasses = 8;

// What a rank measured in its last probe window of one operation family and size class (shm/round_stores.h):
// the window's number (0: none yet) and its medians of the rank's work, ns per byte, cached and streaming (0: no
// sample). The owner writes it at the operation that closes the window, before that operation publishes; peers
// read it at their next operation of the class, after waiting for that step, and every rank picks the stores from
// the same medians (the slowest rank's).
struct RoundVerdict {
  std::atomic<uint32_t> window;
  std::atomic<float> cachedNsPerByte;
  std::atomic<float> streamingNsPerByte;
};
static_assert(sizeof(RoundVerdict) == 12, "RoundVerdict layout changed: bump kProtocolVersion");
static_assert(std::atomic<float>::is_always_lock_free, "cross-process atomics must be lock-free");

// The collectives that may run zero-copy on symmetric buffers (all_reduce, all_gather, reduce_scatter, broadcast), the
// paths each may take (copying, zero-copy with cached or with streaming stores) and their size classes
// (shm/zero_copy/path_chooser.h).
constexpr int kZeroCopyOps = 4;
constexpr int kZeroCopyPaths = 3;
constexpr int kPathSizeClasses = 11;

// What a rank measured in its last probe window of one zero-copy-capable collective and size class
// (shm/zero_copy/path_chooser.h): the window's number (0: none yet) and its median time per byte on each path (0: no
// sample). Written and read as RoundVerdict is: by the owner at the operation that closes the window, before it
// publishes; by the peers at their next operation of the class, after waiting for that step.
struct PathVerdict {
  std::atomic<uint32_t> window;
  std::atomic<float> nsPerByte[kZeroCopyPaths];
};
static_assert(sizeof(PathVerdict) == 16, "PathVerdict layout changed: bump kProtocolVersion");

struct alignas(kCacheLine) RankCtl {
  // Cache line 0: the last protocol step this rank published (monotonic; release by the owner).
  std::atomic<uint64_t> step;
  // Cache line 1: liveness. The heartbeat counter moves every heartbeat period while the process lives.
  alignas(kCacheLine) std::atomic<uint64_t> heartbeat;
  int32_t pid;
  uint32_t reserved0;
  uint64_t pidNamespace;  // inode of /proc/self/ns/pid: kill()/proc checks only within the same namespace
  uint64_t startTime;     // process start time (/proc/self/stat field 22), guards against pid reuse
  // Cache line 2: held by this rank's heartbeat thread while the rank is in the group (sync.h LifeLock), so peers
  // know of its death exactly; the heartbeat is only a last resort where the lock cannot tell.
  alignas(kCacheLine) core::LifeLock life;
  // Cache lines 3+: the operation descriptor, one per buffer so a rank that runs ahead never overwrites one a
  // slower peer is still comparing.
  alignas(kCacheLine) OpDesc desc[kNumBuffers];
  // Cache lines 5-18: this rank's last probe verdicts, per operation family and size class.
  alignas(kCacheLine) RoundVerdict verdicts[kRoundFamilies][kRoundSizeClasses];
  // Cache lines 19-29: this rank's last zero-copy path verdicts, per collective and size class.
  alignas(kCacheLine) PathVerdict pathVerdicts[kZeroCopyOps][kPathSizeClasses];
};
static_assert(sizeof(RankCtl) % kCacheLine == 0, "RankCtl must not share cache lines");
static_assert(offsetof(RankCtl, heartbeat) == kCacheLine, "heartbeat must sit on its own cache line");
static_assert(sizeof(core::LifeLock) <= kCacheLine, "the life lock must fit one cache line");
static_assert(offsetof(RankCtl, verdicts) == 5 * kCacheLine, "the verdicts must start their own cache line");
static_assert(offsetof(RankCtl, pathVerdicts) == 19 * kCacheLine, "the path verdicts must start their own cache line");
static_assert(sizeof(RankCtl) == 30 * kCacheLine, "RankCtl layout changed: bump kProtocolVersion, update doctor");

// A rank's symmetric heap (shm/heap.h) as its peers see it: one entry per chunk, each its own shared-memory
// segment. The owner fills entry i and then publishes `chunks` = i + 1 (release); a peer maps a chunk when it
// first needs it, adds one to its `mappedBy`, and the peer that brings it to worldSize - 1 unlinks the name, so a
// chunk's name lives only from its creation to the first operation all peers run on it.
constexpr int kMaxHeapChunks = 32;
constexpr size_t kHeapNameBytes = 112;

struct alignas(kCacheLine) HeapChunkEntry {
  uint64_t bytes;
  std::atomic<uint32_t> mappedBy;  // peers that have mapped this chunk (bumped by the peers)
  uint32_t reserved;
  char name[kHeapNameBytes];  // NUL-terminated POSIX shared-memory name
};
static_assert(sizeof(HeapChunkEntry) == 2 * kCacheLine, "HeapChunkEntry layout changed: bump kProtocolVersion");

struct alignas(kCacheLine) HeapTable {
  std::atomic<uint32_t> chunks;  // entries published so far (release by the owner)
  alignas(kCacheLine) HeapChunkEntry entry[kMaxHeapChunks];
};
static_assert(sizeof(HeapTable) == kCacheLine + kMaxHeapChunks * sizeof(HeapChunkEntry),
              "HeapTable layout changed: bump kProtocolVersion, update doctor");

inline size_t roundUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Offsets of each region for a group of `worldSize` ranks with `slotBytes` slots.
struct SegmentGeometry {
  size_t ctlOffset;
  size_t heapOffset;
  size_t dataOffset;
  size_t totalBytes;
  size_t slotBytes;

  SegmentGeometry(int worldSize, size_t slot)
      : ctlOffset(kPage),
        heapOffset(kPage + sizeof(RankCtl) * size_t(worldSize)),
        dataOffset(roundUp(heapOffset + sizeof(HeapTable) * size_t(worldSize), kPage)),
        totalBytes(dataOffset + size_t(worldSize) * kNumBuffers * slot),
        slotBytes(slot) {}
  size_t slotOffset(int rank, int buffer) const {
    return dataOffset + (size_t(rank) * kNumBuffers + size_t(buffer)) * slotBytes;
  }
};

}  // namespace tunedist::shm
