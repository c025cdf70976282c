// Cross-process waiting: spin briefly, then yield, then sleep on a futex in shared memory, while watching the
// deadline, the group's abort word and the liveness of the ranks being waited for.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

namespace tunedist::shm {

// FUTEX_WAIT on a word in MAP_SHARED memory (not the private variant: waiters live in other processes).
// Returns when woken, when *word != expected, on a signal, or after `timeout`.
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::milliseconds timeout);
void futexWakeAll(std::atomic<uint32_t>* word);

// Sleeps until one of `words` differs from its expected value, somebody wakes it, or `deadline` passes. Uses
// futex_waitv (Linux 5.16+); where the kernel (or a seccomp policy) refuses it, sleeps on the first word only
// with slices of at most `fallbackSlice`, so the others are polled. `supported` carries that finding across calls.
void futexWaitAny(const std::vector<std::pair<std::atomic<uint32_t>*, uint32_t>>& words,
                  std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds fallbackSlice,
                  bool* supported);

// One pause hint (x86 `pause`), so a spinning waiter leaves the core's resources to its sibling.
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

// Identity of this process as peers see it: pid, pid namespace and start time.
struct ProcessIdentity {
  int32_t pid;
  uint64_t pidNamespace;
  uint64_t startTime;
  static ProcessIdentity self();
};

// True when `who` is in our pid namespace and is certainly gone: no such pid, a zombie, or a reused pid.
// False when it lives, or when we cannot see it (another namespace): then only its heartbeat can tell.
bool processCertainlyGone(const ProcessIdentity& who);

}  // namespace tunedist::shm
