// SymmetricRegion: one rendezvous of a symmetric allocation, as torch's symmetric memory and c10d windows on CPU see
// it (backend/cpu/symm_mem/): every rank's buffer mapped in this process, every rank's signal pad (a zeroed block
// of the same heap, exchanged beside the buffer), and the waits on words in those pads.
//
// A wait never hangs: it ends with an error at its deadline (naming the peer and what it waited for), at once when
// the group has failed (a peer's abort included), and within the group's peer-check period when the peer it waits
// for is dead (its life lock free or owner-died, shm/group_segment.h): that also fails the group, as a collective
// that found the death would, so every rank stops waiting and the heap's chunk names are removed.
//
// Lifetime: the region holds its group's backend weakly (a tensor deleter may drop the last handle on any thread,
// the executor's included, where destroying the backend would join that very thread). Every use takes a strong
// reference for its duration and fails, naming the op, once the group has been destroyed; the peers' buffers stay
// mapped exactly as long as the group does.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/sync.h"
#include "shm/heap.h"
#include "shm/zero_copy/zero_copy.h"

namespace tunedist::cpu {
class CpuBackend;
}  // namespace tunedist::cpu

namespace tunedist::cpu::symm_mem {

class SymmetricRegion {
 public:
  // Collective on `owner`'s group (its CPU side `cpu`): every rank's `bytes` at `ptr`, which must lie in this rank's
  // heap of that group, and a fresh zeroed signal pad of `padBytes` per rank. `op` names the call in errors.
  static std::shared_ptr<SymmetricRegion> rendezvous(const c10::intrusive_ptr<c10d::Backend>& owner, CpuBackend& cpu,
                                                     const char* op, void* ptr, size_t bytes, size_t padBytes);
  ~SymmetricRegion();
  SymmetricRegion(const SymmetricRegion&) = delete;
  SymmetricRegion& operator=(const SymmetricRegion&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t bytes() const { return bytes_; }
  size_t padBytes() const { return padBytes_; }
  // Rank p's buffer and signal pad, mapped here. Throws, naming `op`, once the group is gone.
  char* buffer(const char* op, int p) const;
  uint8_t* pad(const char* op, int p) const;
  std::vector<void*> buffers(const char* op) const;
  std::vector<void*> pads(const char* op) const;
  // The group's timeout, for a wait given none (0).
  std::chrono::milliseconds timeoutOr(size_t timeoutMs) const;
  // Throws (c10::DistBackendError naming `op` and both ranks) unless `peer` is a rank of the group.
  void checkPeer(const char* op, int64_t peer) const;

  // Waits until `ready()` holds, for at most `timeout`, while `peer` is the rank expected to make it true; `what`
  // says what we wait for ("a signal on channel 0"). As the group's own waits do (shm/rounds.cpp): spin with a pause
  // hint where every rank has a CPU of its own (a peer on another core answers within microseconds), then yield the
  // core a few times, then sleep on the group's bell (a futex in its segment) that notify() rings; between sleeps, and
  // every millisecond while spinning, it checks the group, the peer and the deadline (a check reads the peer's life
  // lock and /proc: too dear for every turn). `ready` must read with seq_cst, pairing with notify()'s check for
  // sleepers.
  template <typename Ready>
  void waitFor(const char* op, int peer, std::chrono::milliseconds timeout, const std::string& what, Ready&& ready) {
    if (ready()) {
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    auto lastCheck = start;
    // The group's spin turns (core::ShmOptions::spinIters, resolved for its ranks on this host: none with more ranks
    // than CPUs).
    const uint64_t spinTurns = uint64_t(std::max(segment_->options().spinIters, 0));
    for (uint64_t turn = 1; turn < spinTurns + kYieldTurns; ++turn) {
      if (ready()) {
        return;
      }
      if (turn % 64 == 0) {
        const auto now = std::chrono::steady_clock::now();
        if (now - lastCheck >= kCheckPeriod) {
          lastCheck = now;
          checkWait(op, peer, start, timeout, what);
        }
      }
      if (turn < spinTurns) {
        core::cpuRelax();
      } else {
        yieldCore();
      }
    }
    while (!sleepUntilRung(op, peer, start, timeout, what, ready, lastCheck)) {
    }
  }
  // After a store that may end a peer's waitFor (a signal): rings the group's bell if anybody sleeps on it.
  void notify() const;

 private:
  static constexpr uint64_t kYieldTurns = 16;
  static constexpr std::chrono::milliseconds kCheckPeriod{1};

  // One sleep on the group's bell (at most kCheckPeriod), counted in its sleepers, after checking the group, the
  // peer and the deadline where the last check is kCheckPeriod old; true once `ready()` holds.
  template <typename Ready>
  bool sleepUntilRung(const char* op, int peer, std::chrono::steady_clock::time_point start,
                      std::chrono::milliseconds timeout, const std::string& what, Ready& ready,
                      std::chrono::steady_clock::time_point& lastCheck) {
    std::atomic<uint32_t>& bell = bellWord();
    std::atomic<uint32_t>& sleepers = sleepersWord();
    // seq_cst: a signaller that stores after our check sees us counted and rings (notify()).
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = bell.load(std::memory_order_seq_cst);
    bool done = ready();
    if (!done) {
      try {
        const auto now = std::chrono::steady_clock::now();
        if (now - lastCheck >= kCheckPeriod) {
          lastCheck = now;
          checkWait(op, peer, start, timeout, what);
        }
      } catch (...) {
        sleepers.fetch_sub(1, std::memory_order_seq_cst);
        throw;
      }
      core::futexWait(&bell, seen, kCheckPeriod);
      done = ready();
    }
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
    return done;
  }
  std::atomic<uint32_t>& bellWord() const;
  std::atomic<uint32_t>& sleepersWord() const;

  SymmetricRegion() = default;
  // Throws when the group failed, the peer is dead (failing the group first) or the deadline passed.
  void checkWait(const char* op, int peer, std::chrono::steady_clock::time_point start,
                 std::chrono::milliseconds timeout, const std::string& what);
  static void yieldCore();
  // The backend, strongly, for one use; throws naming `op` once the group was destroyed.
  c10::intrusive_ptr<c10d::Backend> lease(const char* op) const;
  [[noreturn]] void fail(const char* op, const std::string& message) const;

  c10::weak_intrusive_ptr<c10d::Backend> owner_{c10::intrusive_ptr<c10d::Backend>()};
  shm::GroupSegment* segment_ = nullptr;
  std::chrono::milliseconds timeout_{0};
  int rank_ = 0;
  int size_ = 0;
  size_t bytes_ = 0;
  size_t padBytes_ = 0;
  std::vector<char*> buffers_;
  std::vector<char*> pads_;
  // Our own pad: a block of our heap, returned to it with the region.
  std::shared_ptr<shm::SymmetricHeap> heap_;
  void* ownPad_ = nullptr;
};

}  // namespace tunedist::cpu::symm_mem
