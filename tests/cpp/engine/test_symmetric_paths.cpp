// The measured zero-copy-or-copy choice in real groups (shm/zero_copy/path_chooser.h): with some paths made slow
// (TUNEDIST_TEST_SLOW_PATHS) every rank ends on the same fast path for every collective, whatever the world size;
// results stay exact on every path and through the probe windows, also when one rank passes a plain buffer in the
// middle of a window (the group restarts that operation on the copying path and the schedules stay aligned); a forced
// threshold never copies.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "scoped_env.h"
#include "shm/heap.h"
#include "shm/zero_copy/path_chooser.h"
#include "shm/zero_copy/zero_copy.h"
#include "shm_test_util.h"

namespace tunedist::test {
namespace {

using shm::HeapRef;
using shm::SymmetricHeap;
using shm::zero_copy::Path;
using shm::zero_copy::PathChooser;
using Zc = shm::zero_copy::ZeroCopyCollectives;

// Enough operations of each class for one probe window (three paths), its verdict, and kAfter operations on the path
// the group keeps.
constexpr int kAfter = 6;
constexpr int kIterations = int(PathChooser::kWarmOps + 6 * PathChooser::kBlockOps) + 2 + kAfter;

HeapRef refOf(const SymmetricHeap& heap, const void* p, size_t bytes) {
  HeapRef ref;
  if (!heap.locate(p, bytes, &ref)) {
    failCheck("buffer not found in its own heap");
  }
  return ref;
}

void runGroup(int size, const ShmOptions& options, const std::function<void(Peer&, SymmetricHeap&)>& body) {
  auto rendezvous = std::make_shared<MemRendezvous>();
  rethrowFailures(spawn(size, [&](int r) {
    shm::HeapOptions ho;
    ho.chunkBytes = 4 << 20;
    ho.maxBytes = 16 << 20;
    auto heap = std::make_shared<SymmetricHeap>(ho, core::detail::str("rank ", r));
    Peer peer(rendezvous, r, size, options, heap);
    abortingOnThrow({&peer.comm}, [&] { body(peer, *heap); });
  }));
}

// One iteration: all_reduce (64 KiB), all_gather (32 KiB per rank), reduce_scatter (32 KiB per rank) and broadcast
// (64 KiB, root 0) on symmetric buffers, each checked against its closed form. At iteration `plainAt`, rank 0 passes
// a plain buffer to the all_reduce (counted with pass(), as the backend does).
void iterate(Peer& p, SymmetricHeap& heap, int it, int plainAt) {
  const int r = p.rank();
  const int n = p.size();
  const size_t count = 16384;
  auto* ar = static_cast<float*>(heap.allocate(count * sizeof(float)));
  std::vector<float> plain(count);
  const bool usePlain = it == plainAt && r == 0;
  float* buf = usePlain ? plain.data() : ar;
  for (size_t i = 0; i < count; ++i) {
    buf[i] = float((r + 1) * int(i % 7 + 1));
  }
  if (usePlain) {
    p.comm.zeroCopy()->pass(Zc::kAllreduce, count * sizeof(float));
    p.comm.allreduce(p.op("all_reduce"), buf, buf, count, floatSum());
  } else {
    p.comm.zeroCopy()->allreduce(p.op("all_reduce"), buf, refOf(heap, buf, count * sizeof(float)), count, floatSum());
  }
  for (size_t i = 0; i < count; ++i) {
    if (buf[i] != float(n * (n + 1) / 2 * int(i % 7 + 1))) {
      failCheck("all_reduce iteration ", it, ": rank ", r, " index ", i, ": got ", buf[i]);
    }
  }
  heap.free(ar);

  const size_t block = size_t(32) << 10;
  auto* out = static_cast<uint8_t*>(heap.allocate(block * size_t(n)));
  const std::vector<uint8_t> mine = patternBytes(r, block, it);
  std::copy(mine.begin(), mine.end(), out + size_t(r) * block);
  p.comm.zeroCopy()->allgather(p.op("all_gather"), out + size_t(r) * block, block, out,
                               refOf(heap, out, block * size_t(n)));
  for (int q = 0; q < n; ++q) {
    checkPattern(core::detail::str("all_gather iteration ", it), r, out + size_t(q) * block, block, q, it);
  }

  auto* rs = reinterpret_cast<float*>(out);
  const size_t rsCount = block / sizeof(float);
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < rsCount; ++i) {
      rs[size_t(q) * rsCount + i] = float(r + 1 + q + int(i % 5));
    }
  }
  std::vector<float> rsOut(rsCount);
  p.comm.zeroCopy()->reduceScatter(p.op("reduce_scatter"), rs, refOf(heap, rs, block * size_t(n)), rsOut.data(),
                                   rsCount, floatSum());
  for (size_t i = 0; i < rsCount; ++i) {
    if (rsOut[i] != float(n * (n + 1) / 2 + n * (r + int(i % 5)))) {
      failCheck("reduce_scatter iteration ", it, ": rank ", r, " index ", i, ": got ", rsOut[i]);
    }
  }
  heap.free(out);

  auto* bc = static_cast<uint8_t*>(heap.allocate(count * sizeof(float)));
  const std::vector<uint8_t> data = patternBytes(r, count * sizeof(float), it + 1);
  std::copy(data.begin(), data.end(), bc);
  p.comm.zeroCopy()->broadcast(p.op("broadcast"), bc, refOf(heap, bc, count * sizeof(float)), count * sizeof(float), 0);
  checkPattern(core::detail::str("broadcast iteration ", it), r, bc, count * sizeof(float), 0, it + 1);
  heap.free(bc);
}

}  // namespace

TEST_CASE("every rank keeps the path the group measured faster, with exact results throughout", "[shm][symmetric]") {
  const int size = GENERATE(2, 3, 4);
  const std::string slow = GENERATE(std::string("copy,streaming"), std::string("cached,streaming"));
  // copy and streaming slow: every collective runs zero-copy with cached stores; cached and streaming: all copy.
  const Path want = slow == "copy,streaming" ? Path::kCachedStores : Path::kCopy;
  INFO("world size " << size << ", slow paths " << slow);
  ScopedEnv env("TUNEDIST_TEST_SLOW_PATHS", slow.c_str());
  ShmOptions options = mediumOptions();  // symmetricMinBytes unset: measured
  ShmLeakCheck leaks;
  runGroup(size, options, [&](Peer& p, SymmetricHeap& heap) {
    uint64_t before = 0;
    for (int it = 0; it < kIterations; ++it) {
      if (it == kIterations - kAfter) {
        before = heap.stats().zeroCopyOps;
      }
      iterate(p, heap, it, /*plainAt=*/5);
    }
    const int n = p.size();
    const size_t classBytes[] = {size_t(64) << 10, (size_t(32) << 10) * size_t(n), (size_t(32) << 10) * size_t(n),
                                 size_t(64) << 10};
    for (Zc::Op op : Zc::kOps) {
      const PathChooser& c = p.comm.zeroCopy()->chooser(op);
      const int cls = PathChooser::classOf(classBytes[op]);
      if (c.path(cls) != want || c.windows(cls) != 1) {
        failCheck("rank ", p.rank(), ": ", Zc::opName(op), " keeps ", shm::zero_copy::pathName(c.path(cls)), " after ",
                  c.windows(cls), " windows; expected ", shm::zero_copy::pathName(want), " after 1");
      }
    }
    const uint64_t ran = heap.stats().zeroCopyOps - before;
    const uint64_t expected = want == Path::kCopy ? 0 : uint64_t(4 * kAfter);
    if (ran != expected) {
      failCheck("rank ", p.rank(), ": ", ran, " zero-copy operations in the last ", kAfter, " iterations; expected ",
                expected);
    }
    if (heap.stats().copyRestarts != 1) {
      failCheck("rank ", p.rank(), ": ", heap.stats().copyRestarts, " restarts; expected 1 (the plain buffer)");
    }
  });
  CHECK(leaks.report() == "");
}

TEST_CASE("a forced threshold runs every collective zero-copy, the stores still measured", "[shm][symmetric]") {
  const int size = GENERATE(2, 4);
  INFO("world size " << size);
  ScopedEnv env("TUNEDIST_TEST_SLOW_PATHS", "streaming");
  ShmOptions options = mediumOptions();
  options.symmetricMinBytes = 0;
  ShmLeakCheck leaks;
  runGroup(size, options, [&](Peer& p, SymmetricHeap& heap) {
    for (int it = 0; it < kIterations; ++it) {
      iterate(p, heap, it, /*plainAt=*/-1);
    }
    if (heap.stats().zeroCopyOps != uint64_t(4 * kIterations)) {
      failCheck("rank ", p.rank(), ": ", heap.stats().zeroCopyOps, " zero-copy operations of ", 4 * kIterations);
    }
    const int cls = PathChooser::classOf(size_t(64) << 10);
    if (p.comm.zeroCopy()->chooser(Zc::kAllreduce).path(cls) != Path::kCachedStores) {
      failCheck("rank ", p.rank(), ": the forced all_reduce did not keep cached stores");
    }
  });
  CHECK(leaks.report() == "");
}

}  // namespace tunedist::test
