// monitored_barrier: a barrier that names the ranks that did not arrive (dist.monitored_barrier), with gloo's
// semantics and gloo's wording (tuned's detail follows gloo's sentence, after "tunedist:").
//
// It runs through the group's store, not the engines: a rank that never arrives must not leave a half-finished
// shared-memory operation or a timed-out point-to-point channel behind (a send that times out breaks its pair's
// ring), so whatever the outcome the group's collectives and send/recv stay usable. It is a debugging aid, rarely
// called, so the store's round trips do not matter.
//
// Protocol (call n of this group; every rank counts its calls; keys under "monitored_barrier/<n>/"):
//   1. A rank r > 0 sets "arrived/<r>" and waits for "verdict".
//   2. Rank 0 waits for the arrival keys in rank order, as gloo does: without wait_all_ranks within one deadline,
//      throwing at the first rank missing ("Rank r failed to pass monitoredBarrier in T ms"), or at once when the
//      time is gone before it could wait for the next rank ("Rank 0 timed out in monitoredBarrier after T ms", so a
//      zero timeout raises at once); with wait_all_ranks it checks every rank and names all the missing ones.
//   3. The verdict is written once, by compareSet (the first writer wins): rank 0 writes "released" when everyone
//      arrived, or "failed:<message>" when it throws; a rank r > 0 whose own wait ran out writes "abandoned:<r>".
//      So a rank that gives up at the same moment rank 0 releases cannot leave the others half released: either the
//      release won (and the late rank passes too) or the abandonment did (and every rank fails).
//   4. On "released" each rank r > 0 sets "left/<r>" and returns; rank 0 waits for every "left" key before it
//      returns and deletes the call's keys. A rank r > 0 makes no store call after its "left" key, so rank 0, which
//      usually hosts the TCP store, may destroy its group (and the store) as soon as it returns: no rank leaves the
//      barrier before every rank can.
// Only rank 0 enforces the barrier's timeout (as gloo does, so the job does not come down on a non-zero rank
// without naming the rank that was late); a rank r > 0 learns rank 0's verdict at once and waits for it at most the
// group's timeout (or the barrier's, if longer). Every wait polls check() (as StoreRendezvous::get does) and stops
// when the group is aborted or shut down.
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace tunedist::cpu {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kReleased[] = "released";
constexpr char kFailed[] = "failed:";
constexpr char kAbandoned[] = "abandoned:";

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }
bool startsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

std::string joinRanks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    out += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  }
  return out;
}

// Cleanup only: a store without deleteKey (some FileStore builds) keeps a few small keys, which is harmless.
void tryDelete(c10d::Store& store, const std::string& key) {
  try {
    store.deleteKey(key);
  } catch (const std::exception&) {
  }
}

// One call of the barrier on one rank.
class MonitoredBarrier {
 public:
  MonitoredBarrier(c10d::Store& store, int rank, int size, uint64_t call, std::chrono::milliseconds timeout,
                   std::chrono::milliseconds groupTimeout, std::function<bool()> stopped)
      : store_(store),
        rank_(rank),
        size_(size),
        prefix_("monitored_barrier/" + std::to_string(call) + "/"),
        timeout_(timeout),
        groupTimeout_(groupTimeout),
        stopped_(std::move(stopped)),
        start_(Clock::now()) {}

  void runRoot(bool waitAllRanks);
  void runPeer();

 private:
  std::string key(const char* what, int r) const { return prefix_ + what + "/" + std::to_string(r); }
  std::string verdictKey() const { return prefix_ + "verdict"; }

  // Polls until `k` is in the store or `deadline` passes; true when the key appeared. Checks at least once, and
  // throws when the group was aborted or shut down meanwhile.
  bool waitForKey(const std::string& k, Clock::time_point deadline);
  // Writes `verdict` unless a verdict is there already; returns the verdict that holds.
  std::string decide(const std::string& verdict) { return text(store_.compareSet(verdictKey(), {}, bytes(verdict))); }
  // Rank 0: publishes the failure to the other ranks (unless a verdict holds already), then throws it.
  [[noreturn]] void failRoot(const std::string& message);
  [[noreturn]] void failPeer(const std::string& detail) const;
  std::string timeoutText() const { return std::to_string(timeout_.count()) + " ms"; }

  c10d::Store& store_;
  const int rank_;
  const int size_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
  const std::chrono::milliseconds groupTimeout_;
  const std::function<bool()> stopped_;
  const Clock::time_point start_;
};

bool MonitoredBarrier::waitForKey(const std::string& k, Clock::time_point deadline) {
  auto pause = std::chrono::microseconds(200);
  while (!store_.check({k})) {
    if (stopped_()) {
      C10_THROW_ERROR(DistBackendError, c10::str("tunedist: monitored_barrier on rank ", rank_, " of ", size_,
                                                 ": the process group was aborted or shut down while it waited"));
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      return false;
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
  return true;
}

void MonitoredBarrier::failRoot(const std::string& message) {
  try {
    decide(kFailed + message);
  } catch (const std::exception&) {
    // The store is gone: the other ranks see that themselves.
  }
  C10_THROW_ERROR(DistBackendError, message);
}

void MonitoredBarrier::failPeer(const std::string& detail) const {
  C10_THROW_ERROR(DistBackendError,
                  c10::str("Rank ", rank_, " successfully reached monitoredBarrier, but received errors while waiting ",
                           "for send/recv from rank 0. Please check rank 0 logs for faulty rank. tunedist: rank ",
                           rank_, " of ", size_, ": ", detail));
}

void MonitoredBarrier::runRoot(bool waitAllRanks) {
  const auto deadline = start_ + timeout_;
  std::vector<int> arrived;
  std::vector<int> missing;
  for (int r = 1; r < size_; ++r) {
    if (!waitAllRanks) {
      // gloo's remaining time: the whole milliseconds left; none left means rank 0 itself timed out.
      const auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start_);
      if (timeout_ - elapsed <= std::chrono::milliseconds(0)) {
        failRoot(c10::str("Rank 0 timed out in monitoredBarrier after ", timeoutText(), ". ",
                          arrived.empty() ? std::string("No ranks successfully processed in monitoredBarrier.")
                                          : "Successfully processed ranks: " + joinRanks(arrived) + ".",
                          " tunedist: rank 0 of ", size_, " had no time left to wait for rank ", r));
      }
    }
    if (waitForKey(key("arrived", r), deadline)) {
      arrived.push_back(r);
      continue;
    }
    missing.push_back(r);
    if (!waitAllRanks) {
      failRoot(c10::str("[Rank 0]: Rank ", r, " failed to pass monitoredBarrier in ", timeoutText(),
                        ". tunedist: rank ", r, " of ", size_, " did not arrive (Timed out after ", timeoutText(),
                        " waiting for it; the first missing rank, wait_all_ranks=True names every missing rank)"));
    }
  }
  if (!missing.empty()) {
    failRoot(c10::str("[Rank 0]: Ranks ", joinRanks(missing), " failed to pass monitoredBarrier in ", timeoutText(),
                      ". tunedist: ", missing.size() == 1 ? "rank " : "ranks ", joinRanks(missing), " of ", size_,
                      " did not arrive (Timed out after ", timeoutText(), " waiting for them)"));
  }
  const std::string verdict = decide(kReleased);
  if (verdict != kReleased) {
    // A rank gave up waiting for the release just before it came: every rank fails, none passes.
    const std::string who = startsWith(verdict, kAbandoned) ? verdict.substr(sizeof(kAbandoned) - 1) : "?";
    failRoot(c10::str("[Rank 0]: Rank ", who, " failed to pass monitoredBarrier in ", timeoutText(),
                      ". tunedist: rank ", who, " of ", size_, " arrived but its own wait for rank 0's release (",
                      std::max(timeout_, groupTimeout_).count(), " ms) ran out before rank 0 released it"));
  }
  // Every rank r > 0 is released: wait until each has made its last store call, so rank 0's return (and the end of
  // its store) cannot cut one off. A live rank answers within one poll; the bound only catches a rank that died or
  // stopped inside the barrier.
  const auto leaveDeadline = Clock::now() + std::max(timeout_, groupTimeout_);
  for (int r = 1; r < size_; ++r) {
    if (!waitForKey(key("left", r), leaveDeadline)) {
      C10_THROW_ERROR(DistBackendError,
                      c10::str("[Rank 0]: Rank ", r, " failed to pass monitoredBarrier in ", timeoutText(),
                               ". tunedist: rank ", r, " of ", size_, " arrived and was released but did not ",
                               "acknowledge the release within ", std::max(timeout_, groupTimeout_).count(),
                               " ms (it died or stopped inside the barrier)"));
    }
  }
  for (int r = 1; r < size_; ++r) {
    tryDelete(store_, key("arrived", r));
    tryDelete(store_, key("left", r));
  }
  tryDelete(store_, verdictKey());
}

void MonitoredBarrier::runPeer() {
  std::string verdict;
  try {
    store_.set(key("arrived", rank_), std::vector<uint8_t>{1});
    const auto wait = std::max(timeout_, groupTimeout_);
    if (waitForKey(verdictKey(), start_ + wait)) {
      verdict = text(store_.get(verdictKey()));
    } else {
      verdict = decide(kAbandoned + std::to_string(rank_));
      if (verdict != kReleased) {
        failPeer(c10::str("Timed out after ", wait.count(), " ms waiting for rank 0 to release the barrier; rank 0 ",
                          "reports the ranks that did not arrive"));
      }
    }
    if (verdict == kReleased) {
      store_.set(key("left", rank_), std::vector<uint8_t>{1});
      return;
    }
  } catch (const c10::DistBackendError&) {
    throw;
  } catch (const std::exception& e) {
    failPeer(c10::str("the process group's store failed: ", e.what()));
  }
  if (startsWith(verdict, kFailed)) {
    failPeer("rank 0 reported: " + verdict.substr(sizeof(kFailed) - 1));
  }
  failPeer(c10::str("rank ", verdict.substr(sizeof(kAbandoned) - 1), " gave up waiting for rank 0's release, so ",
                    "no rank passes"));
}

}  // namespace

void CpuBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  // Zero means zero, as with gloo: only an unset (negative) timeout takes the group's.
  const auto groupTimeout = effectiveTimeout(c10d::kUnsetTimeout);
  const auto timeout = opts.timeout.count() < 0 ? groupTimeout : opts.timeout;
  MonitoredBarrier call(*store_, rank_, size_, ++monitoredBarriers_, timeout, groupTimeout,
                        [this] { return isShutDown(); });
  if (rank_ == 0) {
    call.runRoot(waitAllRanks);
  } else {
    call.runPeer();
  }
}

}  // namespace tunedist::cpu
