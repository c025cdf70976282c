// monitored_barrier: a barrier that names the ranks that did not arrive (dist.monitored_barrier), as gloo's does.
//
// It runs through the group's store, not the engines: a rank that never arrives must not leave a half-finished
// shared-memory operation or a timed-out point-to-point channel behind (a send that times out breaks its pair's
// ring), so whatever the outcome the group's collectives and send/recv stay usable. It is a debugging aid, rarely
// called, so the store's round trips do not matter.
//
// Protocol (call n of this group; every rank counts its calls):
//   1. A rank r > 0 sets "monitored_barrier/<n>/arrived/<r>".
//   2. Rank 0 waits for every arrival key until the deadline. Without waitAllRanks it throws at the first rank
//      missing at the deadline; with it, it collects every missing rank and throws once, naming them all. Either
//      way it sets no release key, so the ranks that did arrive time out too (as with gloo).
//   3. Rank 0 deletes the arrival keys and sets "monitored_barrier/<n>/released".
//   4. Each rank r > 0 waits for the release key until the deadline, then counts itself out with add(); the last
//      one deletes the release key and the counter, so a successful call leaves nothing in the store.
// Waits poll check(), as StoreRendezvous::get does, and never outlast the timeout.
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace tunedist {
namespace {

using Clock = std::chrono::steady_clock;

// Polls until `key` is in the store or `deadline` passes; true when the key appeared. Checks at least once.
bool waitForKey(c10d::Store& store, const std::string& key, Clock::time_point deadline) {
  auto pause = std::chrono::microseconds(200);
  while (!store.check({key})) {
    const auto now = Clock::now();
    if (now >= deadline) {
      return false;
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
  return true;
}

// Cleanup only: a store without deleteKey (some FileStore builds) keeps a few small keys, which is harmless.
void tryDelete(c10d::Store& store, const std::string& key) {
  try {
    store.deleteKey(key);
  } catch (const std::exception&) {
  }
}

std::string joinRanks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    out += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  }
  return out;
}

}  // namespace

void CpuBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  const auto timeout = effectiveTimeout(opts.timeout);
  const auto deadline = Clock::now() + timeout;
  const std::string prefix = "monitored_barrier/" + std::to_string(++monitoredBarriers_) + "/";
  const std::string released = prefix + "released";
  if (rank_ != 0) {
    store_->set(prefix + "arrived/" + std::to_string(rank_), std::vector<uint8_t>{1});
    if (!waitForKey(*store_, released, deadline)) {
      C10_THROW_ERROR(DistBackendError,
                      c10::str("tunedist: monitored_barrier on rank ", rank_, " of ", size_, ": Timed out after ",
                               timeout.count(), " ms waiting for rank 0 to release the barrier; rank 0 reports ",
                               "the ranks that did not arrive"));
    }
    if (store_->add(prefix + "left", 1) == size_ - 1) {
      tryDelete(*store_, released);
      tryDelete(*store_, prefix + "left");
    }
    return;
  }
  std::vector<int> missing;
  for (int r = 1; r < size_; ++r) {
    if (!waitForKey(*store_, prefix + "arrived/" + std::to_string(r), deadline)) {
      missing.push_back(r);
      if (!waitAllRanks) {
        break;
      }
    }
  }
  if (!missing.empty()) {
    C10_THROW_ERROR(DistBackendError,
                    c10::str("tunedist: monitored_barrier on rank 0 of ", size_, ": Timed out after ", timeout.count(),
                             " ms: ", missing.size() == 1 ? "rank " : "ranks ", joinRanks(missing), " did not arrive",
                             waitAllRanks ? "" : " (the first missing rank; wait_all_ranks=True names them all)"));
  }
  for (int r = 1; r < size_; ++r) {
    tryDelete(*store_, prefix + "arrived/" + std::to_string(r));
  }
  store_->set(released, std::vector<uint8_t>{1});
}

}  // namespace tunedist
