#include "shm/heap.h"

#include <algorithm>

#include "core/error.h"
#include "shm/layout.h"

namespace tunedist::shm {

void HeapOptions::validate() const {
  TD_CHECK(chunkBytes >= kPage && chunkBytes % kPage == 0,
           "tunedist: the symmetric heap's chunk (TUNEDIST_SYMMETRIC_CHUNK_BYTES) must be a positive multiple of ",
           kPage, " bytes, got ", chunkBytes);
  TD_CHECK(maxBytes >= chunkBytes, "tunedist: the symmetric heap's bound (TUNEDIST_SYMMETRIC_HEAP_BYTES, ", maxBytes,
           " bytes) must be at least one chunk (TUNEDIST_SYMMETRIC_CHUNK_BYTES, ", chunkBytes, " bytes)");
}

SymmetricHeap::SymmetricHeap(HeapOptions options, std::string owner) : options_(options), owner_(std::move(owner)) {
  options_.validate();
}

bool SymmetricHeap::allocateIn(Chunk& c, size_t ci, size_t bytes, void** out) {
  // First fit by offset: FSDP-style workloads free and reallocate the same sizes every step, which first fit
  // serves from the same blocks without fragmenting.
  for (auto it = c.freeBlocks.begin(); it != c.freeBlocks.end(); ++it) {
    if (it->second < bytes) {
      continue;
    }
    const size_t offset = it->first;
    const size_t left = it->second - bytes;
    c.freeBlocks.erase(it);
    if (left > 0) {
      c.freeBlocks.emplace(offset + bytes, left);
    }
    char* p = c.base() + offset;
    live_.emplace(reinterpret_cast<uintptr_t>(p), Block{ci, offset, bytes});
    *out = p;
    return true;
  }
  return false;
}

void* SymmetricHeap::allocate(size_t request) {
  TD_CHECK(request > 0, "tunedist: symmetric allocation on ", owner_, ": size must be positive");
  const size_t bytes = roundUp(request, HeapOptions::kAlignment);
  std::lock_guard<std::mutex> lock(mutex_);
  void* p = nullptr;
  for (size_t ci = 0; ci < chunks_.size() && p == nullptr; ++ci) {
    allocateIn(*chunks_[ci], ci, bytes, &p);
  }
  if (p == nullptr) {
    const size_t chunkBytes = std::max(options_.chunkBytes, roundUp(bytes, kPage));
    TD_CHECK(chunks_.size() < size_t(kMaxHeapChunks), "tunedist: symmetric allocation of ", request, " bytes on ",
             owner_, ": the heap already has ", kMaxHeapChunks, " chunks (", stats_.reservedBytes, " bytes, ",
             stats_.inUseBytes,
             " in use). Fix: free symmetric tensors you no longer need, or raise TUNEDIST_SYMMETRIC_CHUNK_BYTES so "
             "fewer, larger chunks hold them");
    TD_CHECK(stats_.reservedBytes + chunkBytes <= options_.maxBytes, "tunedist: symmetric allocation of ", request,
             " bytes on ", owner_, " would take the heap to ", stats_.reservedBytes + chunkBytes,
             " bytes, above its bound of ", options_.maxBytes, " (", stats_.inUseBytes,
             " bytes in use). Fix: free symmetric tensors you no longer need, or raise "
             "TUNEDIST_SYMMETRIC_HEAP_BYTES (and give /dev/shm room for it)");
    auto chunk = std::make_unique<Chunk>();
    try {
      chunk->segment = ShmSegment::create(ShmSegment::tagWithPid(HeapOptions::kChunkTag), chunkBytes, options_.shmDir);
    } catch (const std::exception& e) {
      TD_CHECK(false, "tunedist: symmetric allocation of ", request, " bytes on ", owner_, " needs a new ", chunkBytes,
               "-byte chunk of shared memory: ", e.what(),
               ". For the symmetric heap also: free symmetric tensors you no longer need, or lower "
               "TUNEDIST_SYMMETRIC_CHUNK_BYTES");
    }
    TD_CHECK(chunk->segment.name().size() < kHeapNameBytes,
             "tunedist: shared-memory name too long: ", chunk->segment.name());
    if (private_) {
      chunk->segment.unlink();
    }
    chunk->freeBlocks.emplace(0, chunkBytes);
    const size_t ci = chunks_.size();
    chunks_.push_back(std::move(chunk));
    stats_.reservedBytes += chunkBytes;
    stats_.chunkCreations += 1;
    chunkCount_.store(chunks_.size(), std::memory_order_release);
    TD_ASSERT(allocateIn(*chunks_[ci], ci, bytes, &p));
  }
  stats_.allocations += 1;
  stats_.inUseBytes += bytes;
  stats_.peakInUseBytes = std::max(stats_.peakInUseBytes, stats_.inUseBytes);
  return p;
}

void SymmetricHeap::free(void* ptr) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == live_.end()) {
    return;  // not ours: allocate() never handed it out (the tensor deleter only passes our pointers)
  }
  const Block b = it->second;
  live_.erase(it);
  stats_.inUseBytes -= b.bytes;
  auto& blocks = chunks_[b.chunk]->freeBlocks;
  size_t offset = b.offset;
  size_t bytes = b.bytes;
  // Coalesce with the free neighbours on both sides.
  auto next = blocks.lower_bound(offset);
  if (next != blocks.end() && next->first == offset + bytes) {
    bytes += next->second;
    next = blocks.erase(next);
  }
  if (next != blocks.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      bytes += prev->second;
      blocks.erase(prev);
    }
  }
  blocks.emplace(offset, bytes);
}

size_t SymmetricHeap::blockBytes(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(reinterpret_cast<uintptr_t>(ptr));
  return it == live_.end() ? 0 : it->second.bytes;
}

bool SymmetricHeap::locate(const void* ptr, size_t bytes, HeapRef* ref) const {
  if (empty() || ptr == nullptr) {
    return false;
  }
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t ci = 0; ci < chunks_.size(); ++ci) {
    const auto base = reinterpret_cast<uintptr_t>(chunks_[ci]->base());
    const size_t size = chunks_[ci]->segment.size();
    if (addr >= base && addr - base <= size && bytes <= size - (addr - base)) {
      ref->chunk = uint32_t(ci);
      ref->offset = addr - base;
      return true;
    }
  }
  return false;
}

std::string SymmetricHeap::chunkName(size_t i) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return chunks_.at(i)->segment.name();
}

size_t SymmetricHeap::chunkBytes(size_t i) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return chunks_.at(i)->segment.size();
}

char* SymmetricHeap::chunkBase(size_t i) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return chunks_.at(i)->base();
}

void SymmetricHeap::unlinkChunk(size_t i) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (i < chunks_.size()) {
    try {
      chunks_[i]->segment.unlink();
    } catch (...) {
      // A failing unlink leaves a name the start-up sweep removes once nobody holds its flock.
    }
  }
}

void SymmetricHeap::makePrivate() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  private_ = true;
  for (auto& c : chunks_) {
    try {
      c->segment.unlink();
    } catch (...) {
      // Left to the start-up sweep, as in unlinkChunk.
    }
  }
}

HeapStats SymmetricHeap::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  HeapStats s = stats_;
  s.chunks = chunks_.size();
  s.zeroCopyOps = zeroCopyOps_.load(std::memory_order_relaxed);
  s.copyRestarts = copyRestarts_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace tunedist::shm
