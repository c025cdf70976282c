// Cross-process waiting: spin briefly, then yield, then sleep on a futex in shared memory, while watching the
// deadline, the group's abort word and the liveness of the ranks being waited for.
#pragma once

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

namespace tunedist::core {

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

// LifeLock: a robust, process-shared mutex in shared memory that one thread of a rank's process holds for as long
// as the rank takes part in a group. When that process dies, however it dies and in whatever pid namespace, the
// kernel releases the mutex as owner-died; a process that is stopped (SIGSTOP, a debugger, the cgroup freezer), frozen
// or swapped out keeps holding it. So peers learn of a death exactly, with no timing guess (probeLifeLock).
//
// Protocol:
//   1. The owner initialises the lock (initLifeLock) and its holding thread locks it (holdLifeLock), both before the
//      owner lets peers count it in (the segment's attach counter).
//   2. Peers probe it (probeLifeLock) only after they have seen the owner counted in.
//   3. The holding thread unlocks it (releaseLifeLock) when the rank leaves the group; from then on, as after a
//      death, peers find it free.
struct LifeLock {
  pthread_mutex_t mutex;
};

enum class Liveness {
  kAlive,    // the lock is held: the owner's process exists (it may be stopped)
  kGone,     // the lock is free or its holder died: the owner's process exited or left the group
  kUnknown,  // the lock could not tell (an error from the mutex): fall back to other evidence
};

// Step 1, on the owner's thread: a robust, process-shared mutex. Throws tunedist::core::Error if pthread refuses.
void initLifeLock(LifeLock* lock);
// Step 1, on the holding thread (it must live as long as the hold: a thread's exit also releases it).
void holdLifeLock(LifeLock* lock);
// Step 3, on the holding thread.
void releaseLifeLock(LifeLock* lock);
// Step 2, on any thread of a peer: never blocks. Takes the lock for a moment only when it is free or owner-died.
Liveness probeLifeLock(LifeLock* lock);

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

}  // namespace tunedist::core
