// The floor of a 2-rank all_gather of `total` bytes with plain tensors whose inputs were just written by their owners
// (FSDP: the input was just computed), on two processes pinned to two cores, timed on rank 0, p50 us:
//   zero-copy ideal: each rank's input already lives in shared memory; a rank copies its peer's block straight into
//     its output (and its own block, out of place). No copy into a slot. Any design moves at least this: the peer's
//     block must cross from the peer's core to ours once.
//   copying (the engine's design): copy our block into our 1 MiB slot, publish, copy own block, wait, copy the peer's
//     block out of its slot (cached stores up to 2 MiB received, streaming above, as the engine does).
// reduce_scatter (float32 SUM, input of `total` bytes, each rank ends with the sum of its half):
//   zero-copy ideal: reduce our half of our input with our half of the peer's input, read from shared memory.
//   copying: copy the peer's half of our input into our slot, publish, wait, reduce our half with the peer's slot.
// Both end with a synchronisation (the next call may overwrite the inputs/slots). No c10d, no Python: add the c10d
// floor (a fake-group call) to compare with dist.all_gather_into_tensor.
//   g++ -O2 -std=c++17 -I csrc agbound.cpp -o agbound -L python/tunedist -ltunedist \
//       -Wl,-rpath,$PWD/python/tunedist -Wl,-rpath,<torch>/lib -L<torch>/lib -lc10 -ltorch_cpu
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/reduce.h"

using namespace tunedist::shm;

struct alignas(64) Flag {
  std::atomic<uint64_t> v;
  char pad[56];
};

static void pin(int c) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(c, &s);
  sched_setaffinity(0, sizeof s, &s);
}

// `agbound stale`: inputs written once, before the timing, as bench_ab_builds.py without --fresh (its "stale" rows).
int main(int argc, char** argv) {
  const bool stale = argc > 1 && std::strcmp(argv[1], "stale") == 0;
  const size_t slotB = size_t(1) << 20, maxTotal = size_t(16) << 20, cachedMax = size_t(2) << 20;
  const size_t ctlB = 4096, inB = maxTotal;
  char* shm = static_cast<char*>(mmap(nullptr, ctlB + 2 * inB + 4 * slotB, PROT_READ | PROT_WRITE,
                                      MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0));
  Flag* flag = new (shm) Flag[2]();
  auto sharedIn = [&](int r) { return shm + ctlB + size_t(r) * inB; };
  auto slot = [&](int r, int b) { return shm + ctlB + 2 * inB + (size_t(r) * 2 + b) * slotB; };
  pid_t child = fork();
  const int rank = child == 0 ? 1 : 0, peer = 1 - rank;
  pin(rank);
  std::vector<char> privIn(inB, 1), out(maxTotal, 0);
  uint64_t step = 0;
  auto sync = [&] {
    ++step;
    flag[rank].v.store(step, std::memory_order_release);
    while (flag[peer].v.load(std::memory_order_acquire) < step) {
    }
  };
  auto copyOut = [&](void* d, const void* s, size_t n, size_t received) {
    if (received <= cachedMax) copyBytesCached(d, s, n); else copyBytes(d, s, n);
  };
  sync();
  if (rank == 0)
    printf("# total  all_gather: zero-copy-oop  zero-copy-ip  copying-oop  copying-ip | reduce_scatter: zero-copy  "
           "copying   (p50 us, %s inputs)\n",
           stale ? "stale" : "fresh");
  ReduceArgs sum;
  for (size_t total : {size_t(64) << 10, size_t(256) << 10, size_t(1) << 20, size_t(4) << 20, size_t(16) << 20}) {
    const size_t blk = total / 2;
    const int it = total <= (size_t(1) << 20) ? 400 : 40;
    std::vector<double> t[6];
    for (int i = 0; i < it; i++) {
      for (int m = 0; m < 6; m++) {
        // reduce_scatter's input is `total` bytes: our half (reduced here) and the peer's half (sent), each `blk`.
        char* in = (m < 2 || m == 4) ? sharedIn(rank) : privIn.data();
        if (!stale || i == 0) {
          std::memset(in, (i + m) & 0x3f, m < 4 ? blk : total);  // the owner has just computed it
        }
        sync();
        auto t0 = std::chrono::steady_clock::now();
        const bool oop = (m % 2) == 0;
        if (m >= 4) {
          // Halves: [0, blk) is reduced by rank 0, [blk, 2 blk) by rank 1.
          const void* srcs[2];
          if (m == 4) {
            srcs[rank] = in + rank * blk;
            srcs[peer] = sharedIn(peer) + rank * blk;
            reduce(sum, out.data(), srcs, 2, blk / sizeof(float));
          } else {
            int b = 0;
            for (size_t off = 0; off < blk; off += slotB) {
              const size_t n = std::min(slotB, blk - off);
              copyBytesCached(slot(rank, b), in + peer * blk + off, n);
              ++step;
              flag[rank].v.store(step, std::memory_order_release);
              while (flag[peer].v.load(std::memory_order_acquire) < step) {
              }
              srcs[rank] = in + rank * blk + off;
              srcs[peer] = slot(peer, b);
              reduce(sum, out.data() + off, srcs, 2, n / sizeof(float));
              b ^= 1;
            }
          }
        } else if (m < 2) {
          copyOut(out.data() + peer * blk, sharedIn(peer), blk, blk);
          if (oop) copyBytesCached(out.data() + rank * blk, in, blk);
        } else {
          int b = 0;
          for (size_t off = 0; off < blk; off += slotB) {
            const size_t n = std::min(slotB, blk - off);
            copyBytesCached(slot(rank, b), in + off, n);
            ++step;
            flag[rank].v.store(step, std::memory_order_release);
            if (oop) copyBytesCached(out.data() + rank * blk + off, in + off, n);
            while (flag[peer].v.load(std::memory_order_acquire) < step) {
            }
            copyOut(out.data() + peer * blk + off, slot(peer, b), n, blk);
            b ^= 1;
          }
        }
        sync();
        t[m].push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      }
    }
    for (auto& v : t) std::sort(v.begin(), v.end());
    if (rank == 0)
      printf("%6zuK  %12.1f  %12.1f  %11.1f  %10.1f | %9.1f  %7.1f\n", total >> 10, t[0][it / 2], t[1][it / 2],
             t[2][it / 2], t[3][it / 2], t[4][it / 2], t[5][it / 2]);
  }
  if (child) kill(child, SIGKILL);
  return 0;
}
