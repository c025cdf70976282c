// The symmetric heap (shm/heap.h) and the zero-copy collectives (shm/zero_copy/): the allocator's reuse, bounds and
// errors; zero-copy results bit-identical to the copying algorithms at every world size and count; ranks that
// disagree on symmetry all restarting on the copying path; chunk names gone once every peer mapped them.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <random>

#include "shm/heap.h"
#include "shm/zero_copy/zero_copy.h"
#include "shm_test_util.h"

namespace tunedist::test {
namespace {

using shm::HeapOptions;
using shm::HeapRef;
using shm::SymmetricHeap;

HeapOptions smallHeap() {
  HeapOptions o;
  o.chunkBytes = 1 << 20;
  o.maxBytes = 4 << 20;
  return o;
}

// Whether the shared-memory name ("/tunedist_...") of a heap chunk still exists.
bool nameExists(const std::string& name) {
  struct stat st {};
  return stat(("/dev/shm" + name).c_str(), &st) == 0;
}

// The first of `heap`'s chunks whose name still exists, or "".
std::string linkedChunk(const SymmetricHeap& heap) {
  for (size_t i = 0; i < heap.chunkCount(); ++i) {
    if (nameExists(heap.chunkName(i))) {
      return heap.chunkName(i);
    }
  }
  return "";
}

// Two-phase barrier for a fixed number of threads.
class ThreadBarrier {
 public:
  explicit ThreadBarrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return gen != generation_; });
  }

 private:
  const int n_;
  int arrived_ = 0;
  int generation_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
};

// Float values that differ per rank and index and whose sums round (so a different order of terms shows).
std::vector<float> randomFloats(int rank, size_t n, int salt) {
  std::mt19937 gen(uint32_t(rank * 7919 + salt));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = dist(gen) * 1e3f;
  }
  return v;
}

ShmOptions zeroCopyOptions() {
  ShmOptions o = mediumOptions();
  o.symmetricMinBytes = 0;
  return o;
}

// A group whose ranks each have a heap of their own.
void runSymmetricGroup(int size, const std::function<void(Peer&, SymmetricHeap&)>& body) {
  auto rendezvous = std::make_shared<MemRendezvous>();
  rethrowFailures(spawn(size, [&](int r) {
    auto heap = std::make_shared<SymmetricHeap>(smallHeap(), core::detail::str("rank ", r));
    Peer peer(rendezvous, r, size, zeroCopyOptions(), heap);
    abortingOnThrow({&peer.comm}, [&] { body(peer, *heap); });
  }));
}

HeapRef refOf(const SymmetricHeap& heap, const void* p, size_t bytes) {
  HeapRef ref;
  if (!heap.locate(p, bytes, &ref)) {
    failCheck("buffer not found in its own heap");
  }
  return ref;
}

}  // namespace

TEST_CASE("the heap reuses freed blocks, coalesces them and stays within its bound", "[heap]") {
  ShmLeakCheck leaks;
  {
    SymmetricHeap heap(smallHeap(), "rank 0 of 1");
    CHECK(heap.empty());
    HeapRef ref;
    int local = 0;
    CHECK_FALSE(heap.locate(&local, sizeof(local), &ref));

    void* a = heap.allocate(1000);
    void* b = heap.allocate(3000);
    CHECK(reinterpret_cast<uintptr_t>(a) % HeapOptions::kAlignment == 0);
    CHECK(reinterpret_cast<uintptr_t>(b) % HeapOptions::kAlignment == 0);
    REQUIRE(heap.locate(b, 3000, &ref));
    CHECK(ref.chunk == 0);
    CHECK(ref.offset == 1024);                     // 1000 rounded up to the 256-byte alignment
    CHECK_FALSE(heap.locate(b, (1 << 20), &ref));  // runs past the chunk's end

    // Freed blocks come back without a new chunk; neighbours coalesce into one block big enough for both.
    heap.free(a);
    heap.free(b);
    void* c = heap.allocate(4000);
    CHECK(c == a);
    auto s = heap.stats();
    CHECK(s.chunks == 1);
    CHECK(s.chunkCreations == 1);
    CHECK(s.allocations == 3);
    CHECK(s.inUseBytes == 4096);
    CHECK(s.peakInUseBytes == 4096);
    heap.free(c);
    CHECK(heap.stats().inUseBytes == 0);

    // A request above the chunk size gets a chunk of its own; the bound counts every chunk.
    void* big = heap.allocate((2 << 20) + 1);
    CHECK(heap.stats().chunks == 2);
    CHECK(heap.stats().reservedBytes == (1 << 20) + (2 << 20) + 4096);
    try {
      heap.allocate(2 << 20);
      FAIL("an allocation above the heap's bound must throw");
    } catch (const core::Error& e) {
      CHECK_THAT(e.what(), Catch::Contains("TUNEDIST_SYMMETRIC_HEAP_BYTES") && Catch::Contains("rank 0 of 1"));
    }
    heap.free(big);
    CHECK(heap.allocate(2 << 20) == big);  // the big chunk's block, reused
    CHECK(heap.stats().chunks == 2);
    CHECK_THROWS_WITH(heap.allocate(0), Catch::Contains("size must be positive"));

    // Chunks are 0600 shared memory under this user's prefix.
    for (size_t i = 0; i < heap.chunkCount(); ++i) {
      const std::string name = heap.chunkName(i);
      CHECK(name.rfind("/" + shm::ShmSegment::userPrefix() + "heap_", 0) == 0);
      struct stat st {};
      REQUIRE(stat(("/dev/shm" + name).c_str(), &st) == 0);
      CHECK((st.st_mode & 0777) == 0600);
      CHECK(st.st_uid == getuid());
    }
  }
  CHECK(leaks.report() == "");
}

TEST_CASE("heap options are checked", "[heap]") {
  HeapOptions o;
  o.chunkBytes = 1000;
  CHECK_THROWS_WITH(SymmetricHeap(o, "r"), Catch::Contains("TUNEDIST_SYMMETRIC_CHUNK_BYTES"));
  o.chunkBytes = 8192;
  o.maxBytes = 4096;
  CHECK_THROWS_WITH(SymmetricHeap(o, "r"), Catch::Contains("TUNEDIST_SYMMETRIC_HEAP_BYTES"));
}

TEST_CASE("zero-copy collectives give the copying algorithms' results bit for bit", "[shm][symmetric]") {
  const int size = GENERATE(1, 2, 3, 4);
  INFO("world size " << size);
  ShmLeakCheck leaks;
  runSymmetricGroup(size, [&](Peer& p, SymmetricHeap& heap) {
    const int r = p.rank();
    uint64_t expectedZeroCopy = 0;
    for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(4099), size_t(20011)}) {
      const std::string what = core::detail::str("count ", count);
      const size_t bytes = count * sizeof(float);
      const std::vector<float> input = randomFloats(r, count, int(count));

      // all_reduce, in place.
      auto* sym = static_cast<float*>(heap.allocate(std::max<size_t>(bytes, 1)));
      std::copy(input.begin(), input.end(), sym);
      std::vector<float> plain = input;
      p.comm.zeroCopy()->allreduce(p.op("all_reduce"), sym, refOf(heap, sym, bytes), count, floatSum());
      p.comm.allreduce(p.op("all_reduce"), plain.data(), plain.data(), count, floatSum());
      if (bytes > 0 && std::memcmp(sym, plain.data(), bytes) != 0) {
        failCheck("all_reduce ", what, ": rank ", r, ": zero-copy and copying results differ");
      }
      heap.free(sym);

      // all_gather into a symmetric output, the input being our own block (FSDP2's in-place all-gather).
      auto* out = static_cast<uint8_t*>(heap.allocate(std::max<size_t>(bytes * size_t(p.size()), 1)));
      const std::vector<uint8_t> mine = patternBytes(r, bytes, 5);
      std::copy(mine.begin(), mine.end(), out + size_t(r) * bytes);
      p.comm.zeroCopy()->allgather(p.op("all_gather"), out + size_t(r) * bytes, bytes, out,
                                   refOf(heap, out, bytes * size_t(p.size())));
      for (int q = 0; q < p.size(); ++q) {
        checkPattern("all_gather " + what, r, out + size_t(q) * bytes, bytes, q, 5);
      }

      // reduce_scatter from the same buffer as input (count elements per rank), output in our own block.
      auto* rsIn = reinterpret_cast<float*>(out);
      std::vector<float> all = randomFloats(r + 100, count * size_t(p.size()), 3);
      std::copy(all.begin(), all.end(), rsIn);
      std::vector<const void*> ins(size_t(p.size()));
      for (int q = 0; q < p.size(); ++q) {
        ins[size_t(q)] = all.data() + size_t(q) * count;
      }
      std::vector<float> plainOut(count);
      p.comm.reduceScatter(p.op("reduce_scatter"), ins.data(), plainOut.data(), count, floatSum());
      float* own = rsIn + size_t(r) * count;
      p.comm.zeroCopy()->reduceScatter(p.op("reduce_scatter"), rsIn, refOf(heap, rsIn, bytes * size_t(p.size())), own,
                                       count, floatSum());
      if (bytes > 0 && std::memcmp(own, plainOut.data(), bytes) != 0) {
        failCheck("reduce_scatter ", what, ": rank ", r, ": zero-copy and copying results differ");
      }

      // broadcast from every root.
      for (int root = 0; root < p.size(); ++root) {
        const std::vector<uint8_t> data = patternBytes(r, bytes, 9);
        std::copy(data.begin(), data.end(), out);
        p.comm.zeroCopy()->broadcast(p.op("broadcast"), out, refOf(heap, out, bytes), bytes, root);
        checkPattern("broadcast " + what, r, out, bytes, root, 9);
      }
      heap.free(out);
      expectedZeroCopy += p.size() > 1 ? 3 + uint64_t(p.size()) : 0;
    }
    const auto stats = heap.stats();
    if (stats.zeroCopyOps != expectedZeroCopy || stats.copyRestarts != 0) {
      failCheck("rank ", r, ": ", stats.zeroCopyOps, " zero-copy ops and ", stats.copyRestarts, " restarts; expected ",
                expectedZeroCopy, " and 0");
    }
    // Every peer mapped our chunk in the first zero-copy operation, which removed its name (the later operations'
    // rounds order that before this check).
    if (p.size() > 1 && !linkedChunk(heap).empty()) {
      failCheck("rank ", r, ": heap chunk ", linkedChunk(heap), " still has its name after zero-copy operations");
    }
  });
  CHECK(leaks.report() == "");
}

TEST_CASE("ranks that disagree on symmetry all run the copying algorithm", "[shm][symmetric]") {
  const int size = GENERATE(2, 3);
  INFO("world size " << size);
  ShmLeakCheck leaks;
  runSymmetricGroup(size, [&](Peer& p, SymmetricHeap& heap) {
    const int r = p.rank();
    const size_t count = 5000;
    const size_t bytes = count * sizeof(float);
    auto* sym = static_cast<float*>(heap.allocate(bytes));
    std::vector<float> plain(count);
    const std::vector<float> input = randomFloats(r, count, 1);
    // Rank 0 alone passes a symmetric buffer, then every rank but 0 does.
    for (int round = 0; round < 2; ++round) {
      const bool symmetricHere = (round == 0) == (r == 0);
      float* buf = symmetricHere ? sym : plain.data();
      std::copy(input.begin(), input.end(), buf);
      if (symmetricHere) {
        p.comm.zeroCopy()->allreduce(p.op("all_reduce"), buf, refOf(heap, buf, bytes), count, floatSum());
      } else {
        p.comm.allreduce(p.op("all_reduce"), buf, buf, count, floatSum());
      }
      std::vector<float> reference = input;
      // Every rank runs the same reference: the copying all_reduce of the same inputs.
      p.comm.allreduce(p.op("all_reduce"), reference.data(), reference.data(), count, floatSum());
      if (std::memcmp(buf, reference.data(), bytes) != 0) {
        failCheck("mixed all_reduce round ", round, ": rank ", r, ": result differs from the copying path");
      }
    }
    // Then all symmetric: zero-copy again.
    std::copy(input.begin(), input.end(), sym);
    p.comm.zeroCopy()->allreduce(p.op("all_reduce"), sym, refOf(heap, sym, bytes), count, floatSum());
    const auto stats = heap.stats();
    if (stats.copyRestarts != 2 || stats.zeroCopyOps != 1) {
      failCheck("rank ", r, ": ", stats.copyRestarts, " restarts and ", stats.zeroCopyOps,
                " zero-copy ops; expected 2 and 1");
    }
    heap.free(sym);
  });
  CHECK(leaks.report() == "");
}

TEST_CASE("a chunk's name lives until every peer has mapped it", "[shm][symmetric]") {
  ShmLeakCheck leaks;
  auto rendezvous = std::make_shared<MemRendezvous>();
  ThreadBarrier barrier(2);
  rethrowFailures(spawn(2, [&](int r) {
    auto heap = std::make_shared<SymmetricHeap>(smallHeap(), core::detail::str("rank ", r));
    Peer p(rendezvous, r, 2, zeroCopyOptions(), heap);
    auto* buf = static_cast<float*>(heap->allocate(4096));
    std::fill(buf, buf + 1024, float(r));
    // Nobody has mapped our chunk yet: its name exists.
    const std::string name = heap->chunkName(0);
    const bool before = nameExists(name);
    barrier.wait();
    abortingOnThrow({&p.comm}, [&] {
      if (!before) {
        failCheck("rank ", r, ": chunk ", name, " had no name before the first operation");
      }
      p.comm.zeroCopy()->allreduce(p.op("all_reduce"), buf, refOf(*heap, buf, 4096), 1024, floatSum());
      if (buf[0] != 1.0f || buf[1023] != 1.0f) {
        failCheck("rank ", r, ": all_reduce gave ", buf[0]);
      }
      // The peer mapped it inside the operation, before its last publish: the name is gone while both comms live.
      if (nameExists(name)) {
        failCheck("rank ", r, ": chunk name ", name, " left after every peer mapped it");
      }
    });
    heap->free(buf);
  }));
  CHECK(leaks.report() == "");
}

}  // namespace tunedist::test
