// One POSIX shared-memory segment, owned RAII-style: mapped on construction, unmapped and closed on destruction.
//
// Security and leaks: a segment is created with O_CREAT|O_EXCL and mode 0600 under a name that carries the uid and
// 128 random bits (no other job can guess or collide with it). Every process that maps it holds a shared flock on
// it for as long as it lives. The name is unlinked as soon as every rank has mapped it, so a later SIGKILL leaves
// nothing behind; a rank killed inside the short create-to-unlink window leaves a name whose flock nobody holds,
// and sweepStale() (run at every creation) removes such names of the same user.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "core/options.h"

namespace tunedist::shm {

// `bytes` random bytes from getrandom(), as lowercase hex.
std::string randomHex(size_t bytes);

class ShmSegment {
 public:
  // "tunedist_<uid>_": the prefix of every name this user's jobs create.
  static std::string userPrefix();

  // Creates a fresh segment of `bytes`, reserving every page up front (posix_fallocate) so a full /dev/shm is an
  // error here rather than a SIGBUS later. `tag` becomes part of the name (letters, digits and '_' only). First
  // removes the names of dead jobs at least `sweepMinAge` old (sweepStale).
  static ShmSegment create(const std::string& tag, size_t bytes, const char* shmDir,
                           std::chrono::seconds sweepMinAge = core::ShmOptions::kDefaultSweepMinAge);
  // Opens and maps a segment another rank created; checks its size is `bytes`. If the name does not exist and
  // `notFound` is given, sets *notFound and returns an invalid segment instead of throwing.
  static ShmSegment open(const std::string& name, size_t bytes, bool* notFound = nullptr);
  // Removes names of this user's segments in shmDir that no live process has mapped (no flock held) and that
  // are older than minAge. Returns how many were removed.
  static int sweepStale(const char* shmDir, std::chrono::seconds minAge);
  // Removes names of this user's segments created with tagWithPid(tag) that nobody has mapped (no flock held) and
  // whose creating process has exited here (no such process, or a zombie) or that are at least 2 s old. A heap
  // chunk of a rank killed before its peers mapped it is such a name. Returns how many were removed.
  static int sweepDeadOwners(const char* shmDir, const std::string& tag);
  // `tag` followed by this process's pid, for sweepDeadOwners.
  static std::string tagWithPid(const std::string& tag);

  ShmSegment() = default;
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  // Removes the name; the mapping stays valid. Idempotent. Throws only for errors other than ENOENT.
  void unlink();
  // Leaves the name to its creator: destroying this object then only unmaps (a reader of a probe segment that
  // other ranks still have to open).
  void keepName() { linked_ = false; }
  bool valid() const { return base_ != nullptr; }
  void* data() const { return base_; }
  size_t size() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  ShmSegment(std::string name, int fd, void* base, size_t bytes, bool linked);
  void reset() noexcept;

  std::string name_;
  int fd_ = -1;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  bool linked_ = false;
};

}  // namespace tunedist::shm
