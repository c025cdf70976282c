// The symmetric heaps as the group sees them: our chunks listed in our HeapTable, peers' chunks mapped on demand,
// and every chunk's name removed as soon as nobody needs it (layout.h HeapTable, heap.h).
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "core/env.h"
#include "core/error.h"
#include "shm/rounds.h"
#include "shm/zero_copy/zero_copy.h"

namespace tunedist::shm::zero_copy {
namespace {

constexpr uint32_t bit(Path p) { return 1u << unsigned(p); }

// The paths a collective may take. reduce_scatter has no stores to pick (it writes only its own output, with the
// reduction's plain stores): its one zero-copy path is kCachedStores. With TUNEDIST_SYMMETRIC_MIN_BYTES set the
// path is zero-copy and only the stores are measured.
PathChooser chooserFor(ZeroCopyCollectives::Op op, bool forced) {
  const uint32_t zeroCopy = op == ZeroCopyCollectives::kReduceScatter
                                ? bit(Path::kCachedStores)
                                : bit(Path::kCachedStores) | bit(Path::kStreamingStores);
  return forced ? PathChooser(zeroCopy, Path::kCachedStores) : PathChooser(zeroCopy | bit(Path::kCopy), Path::kCopy);
}

// TUNEDIST_TEST_SLOW_PATHS: comma-separated path names (copy, cached, streaming).
uint32_t slowPathsFromEnv() {
  uint32_t mask = 0;
  if (auto v = core::envString("TUNEDIST_TEST_SLOW_PATHS")) {
    std::stringstream in(*v);
    std::string name;
    while (std::getline(in, name, ',')) {
      if (name == "copy") {
        mask |= bit(Path::kCopy);
      } else if (name == "cached") {
        mask |= bit(Path::kCachedStores);
      } else if (name == "streaming") {
        mask |= bit(Path::kStreamingStores);
      } else if (!name.empty()) {
        TD_CHECK(false, "tunedist: TUNEDIST_TEST_SLOW_PATHS='", *v, "': '", name,
                 "' is none of copy, cached, streaming");
      }
    }
  }
  return mask;
}

}  // namespace

const char* ZeroCopyCollectives::opName(Op op) {
  switch (op) {
    case kAllreduce: return "all_reduce";
    case kAllgather: return "all_gather";
    case kReduceScatter: return "reduce_scatter";
    case kBroadcast: return "broadcast";
  }
  return "?";
}

ZeroCopyCollectives::ZeroCopyCollectives(Rounds& rounds, std::shared_ptr<SymmetricHeap> heap)
    : rounds_(rounds),
      segment_(rounds.segment()),
      heap_(std::move(heap)),
      peerChunks_(size_t(rounds.size())),
      forced_(rounds.options().symmetricMinBytes.has_value()),
      choosers_{chooserFor(kAllreduce, forced_), chooserFor(kAllgather, forced_), chooserFor(kReduceScatter, forced_),
                chooserFor(kBroadcast, forced_)},
      testSlowPaths_(slowPathsFromEnv()) {
  TD_ASSERT(heap_ != nullptr, "zero-copy collectives without a symmetric heap");
  segment_.setListener(this);
  // Chunks of a rank killed before any table listed them have no owner left to unlink them, and the survivors'
  // abort may have run before that rank finished exiting: a group made after it (dist.shrink_group, or the next
  // job on this host) removes them, once nobody holds them and their creator has exited.
  try {
    ShmSegment::sweepDeadOwners(rounds.options().shmDir, HeapOptions::kChunkTag);
  } catch (...) {
    // Left to the next group's sweep.
  }
}

ZeroCopyCollectives::~ZeroCopyCollectives() {
  segment_.setListener(nullptr);
  // Orphans again after a failure: a peer that died during it may not have been a zombie yet at abort().
  dropHeapNames(segment_.failed());
}

void ZeroCopyCollectives::pass(Op op, size_t bytes) {
  if (rounds_.size() == 1 || bytes < rounds_.options().zeroCopyMinBytes()) {
    return;
  }
  const int cls = PathChooser::classOf(bytes);
  decideDue(op, cls);
  const PathChooser::Plan plan = choosers_[op].next(bytes);
  if (plan.windowClosed) {
    shareVerdict(op, cls);
  }
  choosers_[op].dropPending();
}

void ZeroCopyCollectives::decideDue(Op op, int cls) {
  PathChooser& chooser = choosers_[op];
  if (!chooser.verdictDue(cls)) {
    return;
  }
  // Every rank that closed the window with us published its medians before the step we have since waited for. The
  // slowest rank decides: back to back, an operation starts no sooner than its busiest rank ends the previous one.
  std::array<double, kPaths> slowest{};
  for (int p = 0; p < rounds_.size(); ++p) {
    const PathVerdict& v = segment_.ctl(p).pathVerdicts[op][cls];
    if (v.window.load(std::memory_order_relaxed) != chooser.windows(cls)) {
      continue;  // a rank that did not close this window (its own plans differed) shares nothing
    }
    std::array<double, kPaths> t{};
    bool complete = true;
    for (int k = 0; k < kPaths; ++k) {
      t[size_t(k)] = v.nsPerByte[k].load(std::memory_order_relaxed);
      complete = complete && (!(chooser.allowed() & (1u << k)) || t[size_t(k)] > 0);
    }
    for (int k = 0; k < kPaths && complete; ++k) {
      slowest[size_t(k)] = std::max(slowest[size_t(k)], t[size_t(k)]);
    }
  }
  chooser.decide(cls, slowest);
}

void ZeroCopyCollectives::shareVerdict(Op op, int cls) {
  const PathChooser& chooser = choosers_[op];
  // Plain stores: this operation's first publish releases them; peers read them at their next operation of the class.
  PathVerdict& mine = segment_.ctl(rounds_.rank()).pathVerdicts[op][cls];
  for (int k = 0; k < kPaths; ++k) {
    mine.nsPerByte[k].store(float(chooser.lastMedian(cls, Path(k))), std::memory_order_relaxed);
  }
  mine.window.store(chooser.windows(cls), std::memory_order_relaxed);
}

bool ZeroCopyCollectives::accepts(const void* ptr, size_t bytes, size_t minBytes, HeapRef* ref) const {
  return rounds_.size() > 1 && bytes >= minBytes && heap_->locate(ptr, bytes, ref);
}

// 1. List our chunks created since the last call (entry first, then the count, release), so a peer that sees our
//    next publish can map any chunk our descriptor names.
// 2. Map the chunks peers have listed and we have not mapped yet: the sooner every peer has mapped a chunk, the
//    sooner its name is gone (mapPeerChunk).
void ZeroCopyCollectives::syncHeaps(const core::OpContext& ctx) {
  const int rank = rounds_.rank();
  const int size = rounds_.size();
  const SegmentHeader* header = &segment_.header();
  HeapTable& mine = segment_.heapTable(header, rank);
  const size_t have = heap_->chunkCount();
  TD_ASSERT(have <= size_t(kMaxHeapChunks));
  for (size_t i = heapPublished_; i < have; ++i) {
    HeapChunkEntry& e = mine.entry[i];
    const std::string name = heap_->chunkName(i);
    e.bytes = heap_->chunkBytes(i);
    e.mappedBy.store(0, std::memory_order_relaxed);
    std::memset(e.name, 0, kHeapNameBytes);
    std::memcpy(e.name, name.c_str(), name.size());
  }
  if (have > heapPublished_) {
    heapPublished_ = uint32_t(have);
    mine.chunks.store(heapPublished_, std::memory_order_release);
  }
  for (int p = 0; p < size; ++p) {
    if (p == rank) {
      continue;
    }
    // mapPeerChunk maps every chunk up to the one asked for.
    const uint32_t listed = std::min(segment_.heapTable(header, p).chunks.load(std::memory_order_acquire),
                                     uint32_t(kMaxHeapChunks));
    if (listed > peerChunks_[size_t(p)].size()) {
      mapPeerChunk(ctx, p, listed - 1);
    }
  }
}

char* ZeroCopyCollectives::mapPeerChunk(const core::OpContext& ctx, int p, uint32_t chunk) {
  auto& mapped = peerChunks_[size_t(p)];
  if (chunk < mapped.size()) {
    return static_cast<char*>(mapped[chunk].data());
  }
  HeapTable& table = segment_.heapTable(&segment_.header(), p);
  const uint32_t listed = table.chunks.load(std::memory_order_acquire);
  if (chunk >= listed || chunk >= uint32_t(kMaxHeapChunks)) {
    segment_.fail(ctx,
                  core::detail::str("rank ", p, " named chunk ", chunk, " of its symmetric heap, which lists ", listed,
                                    " chunks (a tunedist bug: report it)"),
                  false, false);
  }
  // Chunks are mapped in index order so `mapped[c]` is chunk c.
  while (mapped.size() <= chunk) {
    const uint32_t c = uint32_t(mapped.size());
    HeapChunkEntry& e = table.entry[c];
    const std::string name(e.name, strnlen(e.name, kHeapNameBytes));
    bool notFound = false;
    ShmSegment seg;
    try {
      seg = ShmSegment::open(name, size_t(e.bytes), &notFound);
    } catch (const std::exception& ex) {
      segment_.fail(ctx, core::detail::str("cannot map chunk ", c, " of rank ", p, "'s symmetric heap: ", ex.what()),
                    false, false);
    }
    if (!seg.valid()) {
      segment_.fail(
          ctx,
          core::detail::str("chunk ", c, " of rank ", p, "'s symmetric heap (", name,
                            ") no longer exists: its name was removed before this rank mapped it (by a start-up "
                            "sweep of another job, or by hand). Allocate symmetric tensors after init_process_group "
                            "and keep /dev/shm to this job"),
          false, false);
    }
    // The peer that completes the set removes the name: from now on nothing can leak it.
    if (e.mappedBy.fetch_add(1, std::memory_order_acq_rel) + 1 == uint32_t(rounds_.size() - 1)) {
      seg.unlink();
    }
    seg.keepName();
    mapped.push_back(std::move(seg));
  }
  return static_cast<char*>(mapped[chunk].data());
}

char* ZeroCopyCollectives::peerBuffer(const core::OpContext& ctx, int p, size_t bytes) {
  const OpDesc& d = rounds_.opDesc(p);
  char* base = mapPeerChunk(ctx, p, d.symChunk);
  const size_t chunkBytes = peerChunks_[size_t(p)][d.symChunk].size();
  if (d.symOffset > chunkBytes || bytes > chunkBytes - d.symOffset) {
    segment_.fail(ctx,
                  core::detail::str("rank ", p, "'s symmetric buffer (chunk ", d.symChunk, ", offset ", d.symOffset,
                                    ", ", bytes, " bytes) lies outside its ", chunkBytes,
                                    "-byte chunk (a tunedist bug: report it)"),
                  false, false);
  }
  return base + d.symOffset;
}

void ZeroCopyCollectives::dropHeapNames(bool orphansToo) noexcept {
  for (size_t i = 0; i < heap_->chunkCount(); ++i) {
    heap_->unlinkChunk(i);
  }
  if (orphansToo) {
    try {
      ShmSegment::sweepDeadOwners(rounds_.options().shmDir, HeapOptions::kChunkTag);
    } catch (...) {
      // Left to the next job's start-up sweep.
    }
  }
  // abort() may run on another thread: read the header as published to every thread.
  const SegmentHeader* header = segment_.sharedHeader();
  if (header == nullptr) {
    return;
  }
  const std::string prefix = "/" + ShmSegment::userPrefix();
  const int size = rounds_.size();
  for (int p = 0; p < size; ++p) {
    HeapTable& table = segment_.heapTable(header, p);
    const uint32_t listed = std::min(table.chunks.load(std::memory_order_acquire), uint32_t(kMaxHeapChunks));
    for (uint32_t c = 0; c < listed; ++c) {
      HeapChunkEntry& e = table.entry[c];
      if (e.mappedBy.load(std::memory_order_acquire) + 1 >= uint32_t(size)) {
        continue;  // every peer mapped it: already unlinked
      }
      const std::string name(e.name, strnlen(e.name, kHeapNameBytes));
      if (name.rfind(prefix, 0) == 0) {
        shm_unlink(name.c_str());  // ENOENT: somebody was first
      }
    }
  }
}

}  // namespace tunedist::shm::zero_copy
