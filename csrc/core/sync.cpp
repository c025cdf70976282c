#include "core/sync.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/error.h"

namespace tunedist::core {
namespace {

uint64_t pidNamespaceInode() {
  struct stat st {};
  if (stat("/proc/self/ns/pid", &st) != 0) {
    return 0;
  }
  return uint64_t(st.st_ino);
}

// Field 3 (state) and field 22 (starttime) of /proc/<pid>/stat. Returns false if unreadable.
bool readProcStat(int32_t pid, char* state, uint64_t* startTime) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", int(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) {
    return false;
  }
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // The command name (field 2) may hold spaces and parentheses: parse from the last ')'.
  char* p = std::strrchr(buf, ')');
  if (p == nullptr) {
    return false;
  }
  p += 2;
  *state = *p;
  // Fields after the state: 4..22, so starttime is the 19th number after it.
  for (int field = 4; field <= 22 && p != nullptr; ++field) {
    p = std::strchr(p, ' ');
    if (p != nullptr) {
      ++p;
    }
  }
  if (p == nullptr) {
    return false;
  }
  *startTime = std::strtoull(p, nullptr, 10);
  return true;
}

}  // namespace

void futexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::milliseconds timeout) {
  struct timespec ts {};
  ts.tv_sec = time_t(timeout.count() / 1000);
  ts.tv_nsec = long((timeout.count() % 1000) * 1000000);
  // EAGAIN (value changed), EINTR and ETIMEDOUT all just return: the caller re-checks its condition.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

ProcessIdentity ProcessIdentity::self() {
  ProcessIdentity id{};
  id.pid = int32_t(getpid());
  id.pidNamespace = pidNamespaceInode();
  char state = 0;
  if (!readProcStat(id.pid, &state, &id.startTime)) {
    id.startTime = 0;
  }
  return id;
}

void initLifeLock(LifeLock* lock) {
  pthread_mutexattr_t attr;
  TD_CHECK(pthread_mutexattr_init(&attr) == 0, "tunedist: pthread_mutexattr_init failed");
  int rc = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  if (rc == 0) {
    rc = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  }
  if (rc == 0) {
    rc = pthread_mutex_init(&lock->mutex, &attr);
  }
  pthread_mutexattr_destroy(&attr);
  TD_CHECK(rc == 0, "tunedist: cannot make the robust process-shared mutex that shows peers this rank is alive: ",
           std::strerror(rc));
}

void holdLifeLock(LifeLock* lock) {
  const int rc = pthread_mutex_lock(&lock->mutex);
  if (rc == EOWNERDEAD) {
    pthread_mutex_consistent(&lock->mutex);  // a probe that died holding it; ours now
    return;
  }
  TD_CHECK(rc == 0, "tunedist: cannot hold the mutex that shows peers this rank is alive: ", std::strerror(rc));
}

void releaseLifeLock(LifeLock* lock) { pthread_mutex_unlock(&lock->mutex); }

Liveness probeLifeLock(LifeLock* lock) {
  const int rc = pthread_mutex_trylock(&lock->mutex);
  if (rc == EBUSY) {
    // Held: by its owner, or for a moment by another peer's probe of a lock already gone (the next probe tells).
    return Liveness::kAlive;
  }
  if (rc == EOWNERDEAD) {
    // The owner died holding it: make it consistent so every later probe finds it free, not unrecoverable.
    pthread_mutex_consistent(&lock->mutex);
    pthread_mutex_unlock(&lock->mutex);
    return Liveness::kGone;
  }
  if (rc == 0) {
    pthread_mutex_unlock(&lock->mutex);
    return Liveness::kGone;
  }
  return Liveness::kUnknown;
}

bool processCertainlyGone(const ProcessIdentity& who) {
  if (who.pid <= 0 || who.pidNamespace == 0 || who.pidNamespace != pidNamespaceInode()) {
    return false;
  }
  if (kill(who.pid, 0) != 0 && errno == ESRCH) {
    return true;
  }
  char state = 0;
  uint64_t start = 0;
  if (!readProcStat(who.pid, &state, &start)) {
    return false;
  }
  return state == 'Z' || state == 'X' || (who.startTime != 0 && start != who.startTime);
}

void futexWaitAny(const std::vector<std::pair<std::atomic<uint32_t>*, uint32_t>>& words,
                  std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds fallbackSlice,
                  bool* supported) {
  TD_ASSERT(!words.empty());
  auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) {
    return;
  }
#if defined(SYS_futex_waitv) && defined(FUTEX_WAITV_MAX)
  if (*supported && words.size() > 1 && words.size() <= FUTEX_WAITV_MAX) {
    struct futex_waitv waiters[FUTEX_WAITV_MAX];
    std::memset(waiters, 0, sizeof(waiters));
    for (size_t i = 0; i < words.size(); ++i) {
      waiters[i].val = words[i].second;
      waiters[i].uaddr = reinterpret_cast<uintptr_t>(words[i].first);
      // Not FUTEX_PRIVATE_FLAG: the rings' bells are shared with other processes.
      waiters[i].flags = FUTEX_32;
    }
    struct timespec ts {};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long ns = (long long)ts.tv_nsec + (long long)left.count() * 1000;
    ts.tv_sec += time_t(ns / 1000000000LL);
    ts.tv_nsec = long(ns % 1000000000LL);
    long rc = syscall(SYS_futex_waitv, waiters, (unsigned)words.size(), 0u, &ts, CLOCK_MONOTONIC);
    if (rc >= 0 || (errno != ENOSYS && errno != EPERM)) {
      // Woken, a value already differed (EAGAIN), a signal or the timeout: the caller re-checks everything.
      return;
    }
    // An old kernel or a seccomp filter without futex_waitv: poll the other words from now on.
    *supported = false;
  }
#else
  *supported = false;
#endif
  auto slice = std::chrono::duration_cast<std::chrono::milliseconds>(left + std::chrono::microseconds(999));
  if (words.size() > 1) {
    slice = std::min(slice, fallbackSlice);
  }
  futexWait(words[0].first, words[0].second, std::max(slice, std::chrono::milliseconds(1)));
}

}  // namespace tunedist::core
