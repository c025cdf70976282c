// g++ -O2 -mavx2 -mfma -std=c++17 store_probe.cpp -o store_probe && ./store_probe
// Two processes pinned to CPUs 0 and 1 sharing one mapping: the primitives of zero-copy and copying all_gather /
// all_reduce at 256 KiB - 16 MiB, timed per rank (median of iterations), steady state (buffers reused as the bench does).
#include <immintrin.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <csignal>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static void ntcopy(char* d, const char* s, size_t n) {
  for (size_t i = 0; i < n; i += 64) {
    __m256i a = _mm256_loadu_si256((const __m256i*)(s + i)), b = _mm256_loadu_si256((const __m256i*)(s + i + 32));
    _mm256_stream_si256((__m256i*)(d + i), a);
    _mm256_stream_si256((__m256i*)(d + i + 32), b);
  }
  _mm_sfence();
}
static void addf(float* o, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; i += 8) _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
}
struct Ctl { alignas(64) std::atomic<uint64_t> step[2][8]; };
static Ctl* ctl;
static int me;
static uint64_t stepv = 0;
static void bar() {
  ++stepv;
  ctl->step[me][0].store(stepv, std::memory_order_release);
  while (ctl->step[1 - me][0].load(std::memory_order_acquire) < stepv) _mm_pause();
}
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int main(int argc, char** argv) {
  const size_t maxN = size_t(16) << 20;
  const size_t slotB = size_t(1) << 20;
  // per rank: in (maxN), out (2 maxN), slot (2 x 1 MiB), buf (maxN, all_reduce)
  const size_t per = maxN * 4 + 2 * slotB;
  char* base = (char*)mmap(nullptr, 2 * per + 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ctl = (Ctl*)base;
  new (ctl) Ctl();
  char* region = base + 4096;
  pid_t child = fork();
  me = child == 0 ? 1 : 0;
  if (child == 0) prctl(PR_SET_PDEATHSIG, SIGKILL);
  cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(me, &cs); sched_setaffinity(0, sizeof cs, &cs);
  auto in = [&](int r) { return region + r * per; };
  auto out = [&](int r) { return region + r * per + maxN; };
  auto slot = [&](int r, int b) { return region + r * per + 3 * maxN + b * slotB; };
  auto buf = [&](int r) { return region + r * per + 3 * maxN + 2 * slotB; };
  memset(in(me), me + 1, per);
  bar();
  {
    // one cache line bounced between the two vCPUs: round trip / 2
    std::atomic<uint64_t>* line = &ctl->step[0][4];
    const int rounds = 200000;
    double t0 = now();
    for (uint64_t i = 0; i < uint64_t(rounds); ++i) {
      if (me == 0) { line->store(2 * i + 1, std::memory_order_release); while (line->load(std::memory_order_acquire) != 2 * i + 2) _mm_pause(); }
      else { while (line->load(std::memory_order_acquire) != 2 * i + 1) _mm_pause(); line->store(2 * i + 2, std::memory_order_release); }
    }
    double t = now() - t0;
    if (me == 0) std::printf("cache-line ping-pong between CPU 0 and CPU 1: %.0f ns one way\n", t / rounds / 2 * 1e9);
    bar();
  }
  const char* names[] = {"ag zc push NT (64K blocks)+own cached", "ag zc push cached memcpy+own cached",
                         "ag copy (slot cached, read peer slot)", "ar zc reduce-own-half+push NT",
                         "ar zc reduce-own-half+push cached", "ar copy two-shot (1 MiB slots)",
                         "NT store to peer-written DRAM dst", "cached store, dst peer-written", "cached store, dst own (hot)",
                         "read peer's freshly written lines"};
  for (size_t N : {size_t(256) << 10, size_t(1) << 20, size_t(4) << 20, size_t(16) << 20}) {
    for (int pat = 0; pat < 10; ++pat) {
      const int iters = N >= (16u << 20) ? 20 : 60;
      std::vector<double> t;
      for (int it = 0; it < iters + 5; ++it) {
        bar();
        double t0 = now();
        const size_t h = N / 2;  // per-rank block: all_gather S = N gathered (2 ranks), all_reduce half
        if (pat == 0 || pat == 1) {
          bar();
          char* dst = out(1 - me) + me * h;
          for (size_t off = 0; off < h; off += 65536) {
            size_t n = std::min<size_t>(65536, h - off);
            if (pat == 0) ntcopy(dst + off, in(me) + off, n); else memcpy(dst + off, in(me) + off, n);
          }
          memcpy(out(me) + me * h, in(me), h);
          bar();
        } else if (pat == 2) {
          for (size_t off = 0; off < h; off += slotB) {
            size_t n = std::min(slotB, h - off);
            int b = (off / slotB) & 1;
            memcpy(slot(me, b), in(me) + off, n);
            bar();
            memcpy(out(me) + me * h + off, in(me) + off, n);
            memcpy(out(me) + (1 - me) * h + off, slot(1 - me, b), n);
          }
          bar();
        } else if (pat == 3 || pat == 4) {
          bar();
          float* mine = (float*)(buf(me) + me * h);
          const float* peer = (const float*)(buf(1 - me) + me * h);
          for (size_t off = 0; off < h; off += 65536) {
            size_t n = std::min<size_t>(65536, h - off);
            addf(mine + off / 4, mine + off / 4, peer + off / 4, n / 4);
            if (pat == 3) ntcopy(buf(1 - me) + me * h + off, (char*)mine + off, n);
            else memcpy(buf(1 - me) + me * h + off, (char*)mine + off, n);
          }
          bar();
        } else if (pat == 5) {
          // two-shot: chunk of one slot split in halves; copy peer's half in; sync; reduce mine into buf, copy to slot; sync; copy out
          for (size_t off = 0; off < N; off += slotB) {
            size_t n = std::min(slotB, N - off), hs = n / 2;
            int b = (off / slotB) & 1;
            char* my = buf(me) + off;
            memcpy(slot(me, b) + (1 - me) * hs, my + (1 - me) * hs, hs);
            bar();
            addf((float*)(my + me * hs), (float*)(my + me * hs), (float*)(slot(1 - me, b) + me * hs), hs / 4);
            memcpy(slot(me, b) + me * hs, my + me * hs, hs);
            bar();
            memcpy(my + (1 - me) * hs, slot(1 - me, b) + (1 - me) * hs, hs);
          }
          bar();
        } else if (pat == 6 || pat == 7) {
          // dst: block of peer's out that the peer wrote last (peer writes our out(me) block meanwhile is avoided: each rank owns a dst)
          char* dst = out(me) + (1 - me) * h;  // block last written by... we write it; peer reads it after
          if (pat == 6) ntcopy(dst, in(me), h); else memcpy(dst, in(me), h);
          bar();
          volatile long s = 0; const long* q = (const long*)(out(1 - me) + me * h); for (size_t i = 0; i < h / 8; i += 8) s += q[i];
          bar();
        } else if (pat == 8) {
          memcpy(out(me), in(me), h);
          bar();
        } else if (pat == 9) {
          memcpy(out(me), in(me), h);
          bar();
          double t1 = now();
          volatile long s = 0; const long* q = (const long*)out(1 - me); for (size_t i = 0; i < h / 8; i += 8) s += q[i];
          t0 = now() - (t1 - t0);  // time only the read
          bar();
        }
        if (it >= 5) t.push_back(now() - t0);
      }
      std::sort(t.begin(), t.end());
      double med = t[t.size() / 2];
      bar();
      if (me == 0) std::printf("N=%6zuK %-40s %8.1f us  (%.1f GB/s of N/2)\n", N >> 10, names[pat], med * 1e6, (N / 2) / med / 1e9);
      fflush(stdout);
    }
  }
  if (child) waitpid(child, nullptr, 0);
}
