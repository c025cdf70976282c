// SymmetricHeap: one rank's memory for the zero-copy engine. Every allocation comes from shared-memory chunks that
// the rank's peers on the host map on demand (ShmComm reads them through the group segment's HeapTable, layout.h),
// so a collective on such a buffer reads and writes peers' buffers directly instead of staging through slots.
//
// A caching allocator: chunks are created (O_EXCL, 0600, 128 random bits in the name, every page reserved up front
// so a full /dev/shm is an error here and not a SIGBUS later) and kept until the heap is destroyed; freed blocks
// go back to their chunk's free list (coalesced) and are reused without a system call. The heap is bounded
// (HeapOptions::maxBytes) and grows one chunk at a time (at least HeapOptions::chunkBytes, at most kMaxHeapChunks
// chunks). Thread-safe: tensors are freed on any thread, collectives look buffers up on the executor's.
//
// Names: a chunk's name is needed only until every peer has mapped it. ShmComm unlinks it as soon as that is so
// (the first zero-copy operation on it, or the next one of the group), on abort, and when the group ends; a rank
// killed before its peers mapped a chunk leaves a name that the peers unlink when they find it dead, or that the
// next job's start-up sweep removes (nobody holds its flock).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/options.h"
#include "shm/segment.h"

namespace tunedist::shm {

struct HeapOptions {
  static constexpr size_t kAlignment = 256;
  // The tag of every chunk's name (with the creator's pid: ShmSegment::tagWithPid, sweepDeadOwners).
  static constexpr const char* kChunkTag = "heap";

  // Smallest chunk the heap creates (TUNEDIST_SYMMETRIC_CHUNK_BYTES); a larger request gets a chunk of its own size.
  size_t chunkBytes = core::ShmOptions::kDefaultSymmetricChunkBytes;
  // Bound on all chunks of one rank's heap (TUNEDIST_SYMMETRIC_HEAP_BYTES).
  size_t maxBytes = core::ShmOptions::kDefaultSymmetricHeapBytes;
  const char* shmDir = "/dev/shm";

  static HeapOptions from(const core::ShmOptions& o) {
    return HeapOptions{o.symmetricChunkBytes, o.symmetricHeapBytes, o.shmDir};
  }
  // Throws tunedist::core::Error naming the variable when a value is out of range.
  void validate() const;
};

// Where a buffer sits in a heap: chunk index and byte offset.
struct HeapRef {
  uint32_t chunk = 0;
  uint64_t offset = 0;
};

struct HeapStats {
  size_t reservedBytes = 0;  // all chunks
  size_t inUseBytes = 0;     // live allocations (rounded to the alignment)
  size_t peakInUseBytes = 0;
  size_t chunks = 0;
  uint64_t allocations = 0;  // calls to allocate() so far
  uint64_t chunkCreations = 0;
  // Collectives of the group this rank ran zero-copy, and ones it started again on the copying path because some
  // rank's buffer was not symmetric.
  uint64_t zeroCopyOps = 0;
  uint64_t copyRestarts = 0;
};

class SymmetricHeap {
 public:
  // `owner` names the rank in messages ("rank 3 of 4").
  SymmetricHeap(HeapOptions options, std::string owner);
  SymmetricHeap(const SymmetricHeap&) = delete;
  SymmetricHeap& operator=(const SymmetricHeap&) = delete;

  // `bytes` (> 0) aligned to kAlignment; throws tunedist::core::Error naming the fix when the bound or /dev/shm is
  // full.
  void* allocate(size_t bytes);
  // Returns a block from allocate() to its chunk. Never throws.
  void free(void* ptr) noexcept;

  // Whether [ptr, ptr + bytes) lies inside one chunk; sets *ref when it does. Lock-free when the heap is empty.
  bool locate(const void* ptr, size_t bytes, HeapRef* ref) const;
  bool empty() const { return chunkCount_.load(std::memory_order_acquire) == 0; }
  // The bytes of the live block that starts at `ptr` (its request rounded to kAlignment), or 0 when no block does.
  size_t blockBytes(const void* ptr) const;

  // Chunks created so far (index order never changes) and their names and sizes, for the group's HeapTable.
  size_t chunkCount() const { return chunkCount_.load(std::memory_order_acquire); }
  std::string chunkName(size_t i) const;
  size_t chunkBytes(size_t i) const;
  char* chunkBase(size_t i) const;
  // Removes chunk i's name (peers have all mapped it, or the group ended); the mapping stays. Never throws.
  void unlinkChunk(size_t i) noexcept;
  // No peer will map this heap's chunks (a group that spans hosts runs no zero-copy collective): removes every
  // chunk's name now and each new chunk's as soon as it is made.
  void makePrivate() noexcept;

  HeapStats stats() const;
  void countZeroCopy() { zeroCopyOps_.fetch_add(1, std::memory_order_relaxed); }
  void countCopyRestart() { copyRestarts_.fetch_add(1, std::memory_order_relaxed); }
  const HeapOptions& options() const { return options_; }

 private:
  struct Chunk {
    ShmSegment segment;
    std::map<size_t, size_t> freeBlocks;  // offset -> bytes, coalesced
    char* base() const { return static_cast<char*>(segment.data()); }
  };
  struct Block {
    size_t chunk;
    size_t offset;
    size_t bytes;
  };
  bool allocateIn(Chunk& c, size_t ci, size_t bytes, void** out);

  const HeapOptions options_;
  const std::string owner_;
  mutable std::mutex mutex_;
  // Chunks are appended, never removed or moved while the heap lives: pointers into them stay valid.
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::atomic<size_t> chunkCount_{0};
  bool private_ = false;
  std::map<uintptr_t, Block> live_;  // by address
  HeapStats stats_;
  std::atomic<uint64_t> zeroCopyOps_{0};
  std::atomic<uint64_t> copyRestarts_{0};
};

}  // namespace tunedist::shm
