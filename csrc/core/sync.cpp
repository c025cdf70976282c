#include "core/sync.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

namespace tunedist::shm {
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

}  // namespace tunedist::shm
