#include "shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <utility>

#include "core/error.h"

namespace tunedist::shm {
std::string randomHex(size_t bytes) {
  unsigned char buf[32];
  TD_ASSERT(bytes <= sizeof(buf));
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = getrandom(buf + got, bytes - got, 0);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    TD_CHECK(n > 0, "tunedist: getrandom failed: ", std::strerror(errno));
    got += size_t(n);
  }
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < bytes; ++i) {
    out.push_back(kHex[buf[i] >> 4]);
    out.push_back(kHex[buf[i] & 15]);
  }
  return out;
}

namespace {

std::string freeSpaceNote(const char* shmDir) {
  struct statvfs vfs {};
  if (statvfs(shmDir, &vfs) != 0) {
    return "";
  }
  double freeMiB = double(vfs.f_bavail) * double(vfs.f_frsize) / (1024.0 * 1024.0);
  double totalMiB = double(vfs.f_blocks) * double(vfs.f_frsize) / (1024.0 * 1024.0);
  return core::detail::str(" (", shmDir, " has ", int64_t(freeMiB), " MiB free of ", int64_t(totalMiB), " MiB)");
}

void* mapFd(int fd, size_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  TD_CHECK(p != MAP_FAILED, "tunedist: mmap of shared memory ", name, " (", bytes,
           " bytes) failed: ", std::strerror(errno));
  return p;
}

}  // namespace

std::string ShmSegment::userPrefix() { return core::detail::str("tunedist_", getuid(), "_"); }

ShmSegment ShmSegment::create(const std::string& tag, size_t bytes, const char* shmDir,
                              std::chrono::seconds sweepMinAge) {
  TD_ASSERT(bytes > 0);
  // Names of dead jobs first, so a crashed predecessor does not eat this job's room. Only names at least
  // sweepMinAge old (core::ShmOptions::sweepMinAge): a younger one may belong to a job that is still attaching.
  sweepStale(shmDir, sweepMinAge);
  std::string name = "/" + userPrefix() + tag + "_" + randomHex(16);
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  TD_CHECK(fd >= 0, "tunedist: cannot create shared memory ", name, ": ", std::strerror(errno));
  // Mark it as in use before anything can fail, so a concurrent sweep never removes it.
  flock(fd, LOCK_SH);
  // fchmod guards against a permissive umask-independent policy: the mode must be exactly 0600.
  if (fchmod(fd, 0600) != 0) {
    int err = errno;
    shm_unlink(name.c_str());
    close(fd);
    TD_CHECK(false, "tunedist: fchmod 0600 on ", name, " failed: ", std::strerror(err));
  }
  int rc = posix_fallocate(fd, 0, off_t(bytes));
  if (rc != 0) {
    shm_unlink(name.c_str());
    close(fd);
    TD_CHECK(false, "tunedist: cannot reserve ", bytes, " bytes (", (bytes + (1 << 20) - 1) >> 20,
             " MiB) of shared memory for a process group", freeSpaceNote(shmDir), ": ", std::strerror(rc),
             ". Fix: give the job more shared memory (docker run --shm-size=1g, or --ipc=host; Kubernetes: an "
             "emptyDir with medium Memory on /dev/shm), or lower TUNEDIST_SLOT_BYTES (each group needs about ",
             "world_size x 2 x slot bytes)");
  }
  void* base = nullptr;
  try {
    base = mapFd(fd, bytes, name);
  } catch (...) {
    shm_unlink(name.c_str());
    close(fd);
    throw;
  }
  return ShmSegment(name, fd, base, bytes, true);
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes, bool* notFound) {
  TD_CHECK(name.rfind("/" + userPrefix(), 0) == 0, "tunedist: refusing to open shared memory '", name,
           "': not a tunedist segment of this user");
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && errno == ENOENT && notFound != nullptr) {
    *notFound = true;
    return ShmSegment();
  }
  TD_CHECK(fd >= 0, "tunedist: cannot open shared memory ", name, ": ", std::strerror(errno),
           " (are all ranks of this group on one host and in one IPC namespace? containers need --ipc=host)");
  flock(fd, LOCK_SH);
  struct stat st {};
  if (fstat(fd, &st) != 0 || size_t(st.st_size) != bytes || st.st_uid != getuid() || (st.st_mode & 0777) != 0600) {
    close(fd);
    TD_CHECK(false, "tunedist: shared memory ", name, " has size ", st.st_size, ", owner ", st.st_uid, " and mode ",
             std::oct, (st.st_mode & 0777), std::dec, "; expected ", bytes, " bytes, owner ", getuid(),
             ", mode 600 (a different tunedist build or a foreign file)");
  }
  void* base = nullptr;
  try {
    base = mapFd(fd, bytes, name);
  } catch (...) {
    close(fd);
    throw;
  }
  // Every rank may unlink once all have mapped it; whoever is first wins, the others see ENOENT.
  return ShmSegment(name, fd, base, bytes, true);
}

namespace {

// Removes each of this user's names in shmDir that no process has mapped and that removable(name without the user
// prefix, age in seconds) approves. Returns how many were removed.
template <typename Removable>
int sweep(const char* shmDir, Removable&& removable) {
  DIR* dir = opendir(shmDir);
  if (dir == nullptr) {
    return 0;
  }
  const std::string prefix = ShmSegment::userPrefix();
  int removed = 0;
  time_t now = time(nullptr);
  while (struct dirent* ent = readdir(dir)) {
    std::string entry = ent->d_name;
    if (entry.rfind(prefix, 0) != 0) {
      continue;
    }
    std::string name = "/" + entry;
    int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      continue;
    }
    struct stat st {};
    bool ok = fstat(fd, &st) == 0 && st.st_uid == getuid() &&
              removable(entry.substr(prefix.size()), int64_t(now - st.st_ctime));
    // An exclusive lock succeeds only when no process holds the shared lock every user of a segment keeps.
    if (ok && flock(fd, LOCK_EX | LOCK_NB) == 0) {
      if (shm_unlink(name.c_str()) == 0) {
        ++removed;
      }
    }
    close(fd);
  }
  closedir(dir);
  return removed;
}

constexpr int64_t kOrphanMinAgeS = 2;

// Whether process `pid` of our pid namespace has exited: no such process, or a zombie its parent has not reaped yet
// (a killed rank is one until its launcher waits for it).
bool processExited(long pid) {
  if (kill(pid_t(pid), 0) != 0) {
    return errno == ESRCH;
  }
  std::FILE* f = std::fopen(core::detail::str("/proc/", pid, "/stat").c_str(), "r");
  if (f == nullptr) {
    return false;
  }
  char buf[512] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  const char* paren = std::strrchr(buf, ')');  // the state follows the command name, which may hold spaces
  return n > 0 && paren != nullptr && paren[1] == ' ' && paren[2] == 'Z';
}

}  // namespace

int ShmSegment::sweepStale(const char* shmDir, std::chrono::seconds minAge) {
  return sweep(shmDir, [&](const std::string&, int64_t age) { return age >= minAge.count(); });
}

std::string ShmSegment::tagWithPid(const std::string& tag) { return core::detail::str(tag, "_", getpid()); }

int ShmSegment::sweepDeadOwners(const char* shmDir, const std::string& tag) {
  const std::string head = tag + "_";
  int removed = 0;
  // A killed process's zombie may still hold its files (and so its flocks) for a moment while its other threads
  // exit: names of exited creators that are still held are tried again, for up to about half a second.
  for (int attempt = 0; attempt < 50; ++attempt) {
    int orphans = 0;
    const int now = sweep(shmDir, [&](const std::string& rest, int64_t age) {
      if (rest.rfind(head, 0) != 0) {
        return false;
      }
      char* end = nullptr;
      const long pid = std::strtol(rest.c_str() + head.size(), &end, 10);
      if (pid <= 0 || end == nullptr || *end != '_') {
        return false;
      }
      // The creator takes its flock right after creating the name, so an unheld name is an orphan once its
      // creator has exited here, or once it is a few seconds old (a creator in another pid namespace); a younger
      // one may be between its shm_open and its flock.
      const bool exited = processExited(pid);
      orphans += exited ? 1 : 0;
      return exited || age >= kOrphanMinAgeS;
    });
    removed += now;
    if (now >= orphans) {
      break;
    }
    usleep(10000);
  }
  return removed;
}

ShmSegment::ShmSegment(std::string name, int fd, void* base, size_t bytes, bool linked)
    : name_(std::move(name)), fd_(fd), base_(base), bytes_(bytes), linked_(linked) {}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    reset();
    name_ = std::move(other.name_);
    fd_ = std::exchange(other.fd_, -1);
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    linked_ = std::exchange(other.linked_, false);
  }
  return *this;
}

ShmSegment::~ShmSegment() { reset(); }

void ShmSegment::unlink() {
  if (!linked_) {
    return;
  }
  linked_ = false;
  if (shm_unlink(name_.c_str()) != 0) {
    TD_CHECK(errno == ENOENT, "tunedist: shm_unlink(", name_, ") failed: ", std::strerror(errno));
  }
}

void ShmSegment::reset() noexcept {
  if (linked_) {
    shm_unlink(name_.c_str());
    linked_ = false;
  }
  if (base_ != nullptr) {
    munmap(base_, bytes_);
    base_ = nullptr;
  }
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
  }
  bytes_ = 0;
}

}  // namespace tunedist::shm
