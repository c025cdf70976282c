// Helpers shared by the engine tests (test_shm_*.cpp), after gloo's BaseTest::spawn: ranks run as threads of one
// process, each with its own ShmComm, over an in-memory rendezvous. Checks inside a rank's thread throw (Catch's
// assertions are not thread-safe); the runner aborts that rank's communicator so its peers fail fast, and the
// main thread rethrows every rank's failure, naming the rank. Also: recording expected failures, data patterns,
// and the /dev/shm leak check every test ends with. Element conversions are in shm_test_dtypes.h.
#pragma once

// TUNEDIST_TEST_UNDER_TSAN: set in a ThreadSanitizer build, where tests that fork processes are left out.
#if defined(__SANITIZE_THREAD__)
#define TUNEDIST_TEST_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TUNEDIST_TEST_UNDER_TSAN 1
#endif
#endif

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "shm/comm.h"
#include "shm/segment.h"

namespace tunedist::test {

using core::DType;
using core::OpContext;
using core::RedOp;
using core::ShmOptions;
using kernels::ReduceArgs;
using shm::ShmComm;
using Ms = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Deadline of ordinary operations: far above what any op needs, even under TSAN on two cores; only a protocol
// that hangs comes near it.
constexpr Ms kOpTimeout{30000};

// Spinning before sleeping only burns the core a waited-for rank needs when, as here, up to 8 rank threads share
// a couple of cores; the tests' own options spin briefly (the defaults keep the long spin covered).
constexpr int kTestSpinIters = 64;

// Tiny slots: two-shot from 1 KiB, several rounds from a few KiB, so every path runs with small counts.
inline ShmOptions smallOptions() {
  ShmOptions o;
  o.slotBytes = 4096;
  o.oneShotMaxBytes = 1024;
  o.spinIters = kTestSpinIters;
  return o;
}

// Slots of 8 KiB with one-shot up to a whole slot.
inline ShmOptions mediumOptions() {
  ShmOptions o;
  o.slotBytes = 8192;
  o.oneShotMaxBytes = 8192;
  o.spinIters = kTestSpinIters;
  return o;
}

inline ReduceArgs floatSum() {
  ReduceArgs a;
  a.dtype = DType::kFloat32;
  a.op = RedOp::kSum;
  return a;
}

// The rendezvous of the engine tests: a map under a mutex; get() blocks until the key exists or times out.
class MemRendezvous final : public core::Rendezvous {
 public:
  void set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      values_[key] = value;
    }
    cv_.notify_all();
  }

  std::string get(const std::string& key, Ms timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return values_.count(key) > 0; })) {
      throw core::Error(core::detail::str("MemRendezvous: key '", key, "' was not set within ", timeout.count(),
                                          " ms"));
    }
    return values_.at(key);
  }

  bool check(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return values_.count(key) > 0;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
};

// One rank's communicator and its operation counter: each op() is the next sequence number with a deadline.
class Peer {
 public:
  // `heap` (may be null): the rank's symmetric heap, for the zero-copy collectives.
  Peer(std::shared_ptr<core::Rendezvous> rendezvous, int rank, int size, const ShmOptions& options,
       std::shared_ptr<shm::SymmetricHeap> heap = nullptr)
      : comm(std::move(rendezvous), rank, size, options, std::move(heap)) {}

  OpContext op(const char* name, Ms timeout = kOpTimeout) { return OpContext{name, seq_++, Clock::now() + timeout}; }
  int rank() const { return comm.rank(); }
  int size() const { return comm.size(); }

  ShmComm comm;

 private:
  uint64_t seq_ = 0;
};

// A check that failed inside a rank's thread.
class CheckFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void failCheck(const Args&... parts) {
  throw CheckFailure(core::detail::str(parts...));
}

// `what` says which case (op, dtype, world size, count), so a failure names case, rank and index.
template <typename G, typename W>
[[noreturn]] void failAt(const std::string& what, int rank, size_t index, const G& got, const W& want) {
  failCheck(what, ": rank ", rank, ", index ", index, ": got ", got, ", expected ", want);
}

inline std::string messageOf(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "(non-standard exception)";
  }
}

// Runs body(rank) on `size` threads and returns what each threw (null where it returned).
inline std::vector<std::exception_ptr> spawn(int size, const std::function<void(int)>& body) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  return errors;
}

// Throws one error that names every rank that failed, with its message.
inline void rethrowFailures(const std::vector<std::exception_ptr>& errors) {
  std::ostringstream os;
  for (size_t r = 0; r < errors.size(); ++r) {
    if (errors[r]) {
      os << "\n  rank " << r << ": " << messageOf(errors[r]);
    }
  }
  if (os.tellp() > 0) {
    throw std::runtime_error("ranks failed:" + os.str());
  }
}

// Runs f(); if it throws, aborts every comm in `comms` first so peers stop waiting for this rank.
template <typename F>
void abortingOnThrow(std::initializer_list<ShmComm*> comms, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    for (ShmComm* c : comms) {
      c->abort(core::detail::str("test rank ", c->rank(), " failed: ", e.what()));
    }
    throw;
  }
}

// A fresh group of `size` ranks, one thread each; returns what each rank's body threw.
inline std::vector<std::exception_ptr> runGroupCollect(int size, const ShmOptions& options,
                                                       const std::function<void(Peer&)>& body) {
  auto rendezvous = std::make_shared<MemRendezvous>();
  return spawn(size, [&](int r) {
    Peer peer(rendezvous, r, size, options);
    abortingOnThrow({&peer.comm}, [&] { body(peer); });
  });
}

inline void runGroup(int size, const ShmOptions& options, const std::function<void(Peer&)>& body) {
  rethrowFailures(runGroupCollect(size, options, body));
}

// ---- Expected failures. ----

// What a call threw: kind, message and when.
struct Caught {
  bool threw = false;
  bool timeout = false;
  bool dead = false;
  std::string message;
  Clock::time_point at;
};

// Runs call() and records the tunedist::core::Error it throws (other exceptions propagate).
template <typename F>
Caught catchError(F&& call) {
  Caught c;
  try {
    call();
  } catch (const core::Error& e) {
    c.threw = true;
    c.timeout = dynamic_cast<const core::TimeoutError*>(&e) != nullptr;
    c.dead = dynamic_cast<const core::PeerDeadError*>(&e) != nullptr;
    c.message = e.what();
  }
  c.at = Clock::now();
  return c;
}

// Throws unless `c` is an error whose message holds every one of `parts`.
inline void expectError(const Caught& c, const std::string& what, int rank, const std::vector<std::string>& parts) {
  if (!c.threw) {
    failCheck(what, ": rank ", rank, " returned normally, expected a tunedist::Error");
  }
  for (const std::string& part : parts) {
    if (c.message.find(part) == std::string::npos) {
      failCheck(what, ": rank ", rank, ": message lacks '", part, "': ", c.message);
    }
  }
}

// ---- Data patterns. ----

// Byte i of a block that rank r sends (salt tells apart e.g. its blocks for different destinations). Not periodic
// under 64 KiB, so a block copied to a wrong offset shows.
inline uint8_t patternByte(int r, size_t i, int salt = 0) {
  return uint8_t(i * 7 + (i >> 8) * 3 + size_t(r) * 61 + size_t(salt) * 17 + 1);
}

inline std::vector<uint8_t> patternBytes(int r, size_t n, int salt = 0) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = patternByte(r, i, salt);
  }
  return v;
}

// Checks `got` holds rank src's block with `salt`; `rank` is the checking rank.
inline void checkPattern(const std::string& what, int rank, const uint8_t* got, size_t n, int src, int salt = 0) {
  const std::vector<uint8_t> want = patternBytes(src, n, salt);
  if (n == 0 || std::memcmp(got, want.data(), n) == 0) {
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != patternByte(src, i, salt)) {
      failAt(what + core::detail::str(" (block of rank ", src, ")"), rank, i, int(got[i]),
             int(patternByte(src, i, salt)));
    }
  }
}

// An output buffer of `count` elements followed by guard bytes, all preset to a fill no result matches; never a
// null pointer, even for count 0.
class Output {
 public:
  Output(DType t, size_t count) : bytes_(count * core::dtypeSize(t)), buf_(bytes_ + kGuard, kFill) {}
  void* data() { return buf_.data(); }
  const void* data() const { return buf_.data(); }
  // Throws unless the guard bytes past the end are untouched.
  void checkGuard(const std::string& what, int rank) const {
    for (size_t i = bytes_; i < buf_.size(); ++i) {
      if (buf_[i] != kFill) {
        failAt(what + " (guard byte past the output)", rank, i - bytes_, int(buf_[i]), int(kFill));
      }
    }
  }

 private:
  static constexpr size_t kGuard = 64;
  static constexpr uint8_t kFill = 0xA5;
  size_t bytes_;
  std::vector<uint8_t> buf_;
};

// ---- /dev/shm leak check. ----

// Entries of /dev/shm with this user's tunedist prefix.
inline std::set<std::string> shmNames() {
  std::set<std::string> names;
  const std::string prefix = shm::ShmSegment::userPrefix();
  if (DIR* dir = opendir("/dev/shm")) {
    while (struct dirent* ent = readdir(dir)) {
      if (std::string(ent->d_name).rfind(prefix, 0) == 0) {
        names.insert(ent->d_name);
      }
    }
    closedir(dir);
  }
  return names;
}

// True when this process holds a file descriptor for /dev/shm/<entry>.
inline bool heldByUs(const std::string& entry) {
  const std::string target = "/dev/shm/" + entry;
  bool found = false;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (struct dirent* ent = readdir(dir)) {
      char link[512];
      ssize_t n = readlinkat(dirfd(dir), ent->d_name, link, sizeof(link) - 1);
      found = found || (n > 0 && std::string(link, size_t(n)).rfind(target, 0) == 0);
    }
    closedir(dir);
  }
  return found;
}

// True when /dev/shm/<entry> exists and nobody else holds the shared lock that every tunedist user of a segment
// keeps (or we hold it): it belongs to no live job of another process.
inline bool orphanedOrOurs(const std::string& entry) {
  int fd = shm_open(core::detail::str("/", entry).c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) {
    return false;
  }
  bool unlocked = flock(fd, LOCK_EX | LOCK_NB) == 0;
  close(fd);
  return unlocked || heldByUs(entry);
}

// Snapshot at construction; report() names the prefixed entries that appeared since and are orphaned or ours.
// Entries that other processes of this user (a concurrent test run) create and hold are not counted.
class ShmLeakCheck {
 public:
  ShmLeakCheck() : before_(shmNames()) {}

  std::string report() const {
    std::string leaked;
    for (int attempt = 0; attempt < 2; ++attempt) {
      leaked.clear();
      for (const std::string& name : shmNames()) {
        if (before_.count(name) == 0 && orphanedOrOurs(name)) {
          leaked += (leaked.empty() ? "" : ", ") + name;
        }
      }
      if (leaked.empty()) {
        break;
      }
      // Another process may be between shm_open and flock: look again a moment later.
      std::this_thread::sleep_for(Ms(100));
    }
    return leaked;
  }

 private:
  std::set<std::string> before_;
};

}  // namespace tunedist::test
