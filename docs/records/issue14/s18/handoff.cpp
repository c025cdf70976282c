// The hand-off of a 2-rank one-shot all_reduce, alone, in steady state: two processes pinned to two cores, double-
// buffered 1 MiB slots as in the engine. Per iteration each rank writes fresh values into its input, copies it into
// its slot b (cached stores), publishes, waits for the peer, and reduces (float32 SUM, the engine's kernel) its input
// with the peer's slot b into its output; a final synchronisation and a ~`gap` us spin stand for the c10d call that
// separates two collectives. Timed on rank 0 from the copy-in to the end of the reduce. Variants, in blocks of 25
// iterations (the first 5 of each block not counted), blocks interleaved:
//   engine     as the engine is today;
//   pfw-after  after the reduce, prefetchw the lines of our other slot (b^1: the next iteration's), which the peer
//              finished reading an iteration ago, so the next copy-in finds them exclusive in our cache;
//   pfw-before prefetchw our slot's lines just before the copy-in (inside the timed part);
//   local      the peer's slot is not read: we reduce our input with our own slot (the lines we wrote) - no transfer;
//   stream / repmovsb / avx512: the engine with the copy-in done by streaming stores (the engine's copyBytes),
//              `rep movsb`, or an aligned 64-byte store loop, in place of memcpy;
//   touch-after after the reduce (untimed, timed apart), store back the first 8 bytes of each line of our other
//              slot, so the next copy-in finds the lines owned;
//   touch-wait the same touch between our publish and the wait (inside the timed part);
//   nta-read   prefetchnta every line of the peer's slot after the wait, then reduce;
//   rotate     each use of a buffer writes (and reads) the next place in its 1 MiB slot (64 KiB apart, or `bytes` when
//              larger), so a line is rewritten only after 16 uses of the buffer (the peer's copy has likely left).
// p10 / p50 / p90 us on rank 0, and the medians of its three parts: copy-in, wait for the peer's publish, reduce.
//   g++ -O2 -std=c++17 -I csrc handoff.cpp -o handoff -L python/tunedist -ltunedist \
//       -Wl,-rpath,$PWD/python/tunedist -Wl,-rpath,<torch>/lib -L<torch>/lib -lc10 -ltorch_cpu
#include <immintrin.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/reduce.h"

using namespace tunedist::shm;
using Clock = std::chrono::steady_clock;

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

static void prefetchWrite(char* p, size_t bytes) {
  for (size_t off = 0; off < bytes; off += 64) {
    __builtin_prefetch(p + off, 1, 3);
  }
}

static void repMovsb(void* d, const void* s, size_t n) {
  asm volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}

__attribute__((target("avx512f"))) static void avx512Copy(void* d, const void* s, size_t n) {
  auto* dp = static_cast<char*>(d);
  auto* sp = static_cast<const char*>(s);
  for (size_t off = 0; off < n; off += 64) {
    _mm512_store_si512(dp + off, _mm512_loadu_si512(sp + off));
  }
}

// Stores back the value each line's first 8 bytes hold: a reader of the line sees no change, and the line becomes
// ours (modified) in our cache.
static void touchSame(char* p, size_t bytes) {
  for (size_t off = 0; off < bytes; off += 64) {
    auto* w = reinterpret_cast<std::atomic<uint64_t>*>(p + off);
    w->store(w->load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
}

int main(int argc, char** argv) {
  const int blocks = argc > 1 ? std::atoi(argv[1]) : 40;
  const double gapUs = argc > 2 ? std::atof(argv[2]) : 8.0;
  const size_t slotB = size_t(1) << 20;
  char* shm = static_cast<char*>(mmap(nullptr, 4096 + 4 * slotB, PROT_READ | PROT_WRITE,
                                      MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0));
  Flag* flag = new (shm) Flag[2]();
  auto slot = [&](int r, int b) { return shm + 4096 + size_t(2 * r + b) * slotB; };
  pid_t child = fork();
  const int rank = child == 0 ? 1 : 0, peer = 1 - rank;
  pin(rank);
  std::vector<float> in(slotB / 4), out(slotB / 4);
  uint64_t step = 0;
  auto sync = [&] {
    flag[rank].v.store(++step, std::memory_order_release);
    while (flag[peer].v.load(std::memory_order_acquire) < step) {
    }
  };
  ReduceArgs sum;
  const char* names[] = {"engine", "pfw-after",   "pfw-before", "local",    "stream", "repmovsb",
                         "avx512", "touch-after", "touch-wait", "nta-read", "rotate"};
  constexpr int kV = 11, kBlock = 25, kWarm = 5;
  sync();
  if (rank == 0) {
    printf("# bytes  variant  p10 p50 p90 us (rank 0, %d blocks of %d, gap %.1f us)\n", blocks, kBlock - kWarm, gapUs);
  }
  int b = 0;
  size_t uses[2] = {0, 0};
  for (size_t bytes : {size_t(4) << 10, size_t(16) << 10, size_t(64) << 10, size_t(256) << 10}) {
    const size_t n = bytes / 4;
    std::vector<double> t[kV], parts[kV][4];
    for (int blk = 0; blk < blocks; blk++) {
      for (int v = 0; v < kV; v++) {
        for (int i = 0; i < kBlock; i++) {
          for (size_t k = 0; k < n; k++) {
            in[k] = float(blk + i + k);
          }
          size_t rot = 0;
          if (v == 10) {
            const size_t stride = std::max(size_t(64) << 10, (bytes + 4095) / 4096 * 4096);
            rot = (uses[b]++ % (slotB / stride)) * stride;
          }
          auto at = [&](int r) { return slot(r, b) + rot; };
          sync();
          auto t0 = Clock::now();
          if (v == 2) {
            prefetchWrite(at(rank), bytes);
          }
          if (v == 4) {
            copyBytes(at(rank), in.data(), bytes);
          } else if (v == 5) {
            repMovsb(at(rank), in.data(), bytes);
          } else if (v == 6) {
            avx512Copy(at(rank), in.data(), bytes);
          } else {
            copyBytesCached(at(rank), in.data(), bytes);
          }
          auto tc = Clock::now();
          if (v == 8) {
            flag[rank].v.store(++step, std::memory_order_release);
            touchSame(slot(rank, b ^ 1), bytes);
            while (flag[peer].v.load(std::memory_order_acquire) < step) {
            }
          } else {
            sync();
          }
          if (v == 9) {
            for (size_t off = 0; off < bytes; off += 64) {
              _mm_prefetch(at(peer) + off, _MM_HINT_NTA);
            }
          }
          auto tw = Clock::now();
          const void* other = v == 3 ? at(rank) : at(peer);
          const void* srcs[2] = {rank == 0 ? static_cast<const void*>(in.data()) : other,
                                 rank == 0 ? other : static_cast<const void*>(in.data())};
          reduce(sum, out.data(), srcs, 2, n);
          auto t1 = Clock::now();
          if (v == 1) {
            prefetchWrite(slot(rank, b ^ 1), bytes);
          }
          double touchUs = 0;
          if (v == 7) {
            auto ts = Clock::now();
            touchSame(slot(rank, b ^ 1), bytes);
            touchUs = std::chrono::duration<double, std::micro>(Clock::now() - ts).count();
          }
          if (i >= kWarm) {
            t[v].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
            parts[v][0].push_back(std::chrono::duration<double, std::micro>(tc - t0).count());
            parts[v][1].push_back(std::chrono::duration<double, std::micro>(tw - tc).count());
            parts[v][2].push_back(std::chrono::duration<double, std::micro>(t1 - tw).count());
            parts[v][3].push_back(touchUs);
          }
          while (std::chrono::duration<double, std::micro>(Clock::now() - t1).count() < gapUs) {
          }
          b ^= 1;
        }
      }
    }
    if (rank == 0) {
      for (int v = 0; v < kV; v++) {
        std::sort(t[v].begin(), t[v].end());
        auto q = [&](double f) { return t[v][size_t(f * double(t[v].size() - 1))]; };
        double med[4];
        for (int k = 0; k < 4; k++) {
          std::sort(parts[v][k].begin(), parts[v][k].end());
          med[k] = parts[v][k][parts[v][k].size() / 2];
        }
        printf("%8zu %-10s %7.2f %7.2f %7.2f   copy-in %6.2f  wait %6.2f  reduce %6.2f  (touch %5.2f)\n", bytes,
               names[v], q(0.1), q(0.5), q(0.9), med[0], med[1], med[2], med[3]);
      }
    }
  }
  return 0;
}
