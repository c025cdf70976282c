// GroupSegment: attaching to the group's segment, the heartbeat, the liveness checks, and failure handling.
#include "shm/group_segment.h"

#include <unistd.h>

#include <cstring>
#include <future>
#include <sstream>

#include "core/error.h"
#include "core/store_keys.h"
#include "core/sync.h"

namespace tunedist::shm {
namespace {

constexpr const char* kSegmentKey = core::keys::kShmSegment;
// Where a rank that fails before the segment exists (no room in /dev/shm, a bad tensor in the first collective)
// leaves its reason, so peers still attaching fail with it instead of waiting for the timeout.
constexpr const char* kAbortKey = core::keys::kShmAbort;
constexpr auto kAttachPoll = std::chrono::milliseconds(10);
constexpr std::chrono::milliseconds kPeerCheckInterval{10};

std::chrono::milliseconds remaining(const core::OpContext& ctx) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(ctx.deadline - std::chrono::steady_clock::now());
  return left.count() > 0 ? left : std::chrono::milliseconds(0);
}

}  // namespace

GroupSegment::GroupSegment(std::shared_ptr<core::Rendezvous> rendezvous, int rank, int size,
                           const core::ShmOptions& options)
    : rendezvous_(std::move(rendezvous)),
      rank_(rank),
      size_(size),
      options_(options.forRanks(size)),
      geometry_(size, options.slotBytes) {
  TD_CHECK(size >= 1 && rank >= 0 && rank < size, "tunedist: invalid rank ", rank, " for group size ", size);
  options_.validate();
  TD_CHECK(rendezvous_ != nullptr, "tunedist: ShmComm needs a rendezvous");
}

GroupSegment::~GroupSegment() {
  heartbeat_.stop.store(true);
  {
    std::lock_guard<std::mutex> lock(heartbeat_.mutex);
    heartbeat_.cv.notify_all();
  }
  if (heartbeat_.thread.joinable()) {
    heartbeat_.thread.join();
  }
}

void GroupSegment::attach(const core::OpContext& ctx) {
  if (map_.header != nullptr) {
    return;
  }
  if (rank_ == 0) {
    createSegment(ctx);
  } else {
    openSegment(ctx);
  }
  waitAllAttached(ctx);
  // Every rank has it mapped: drop the name so nothing can leak, whatever happens to the processes later.
  map_.segment.unlink();
  peers_.lastBeat.assign(size_t(size_), 0);
  peers_.lastBeatChange.assign(size_t(size_), std::chrono::steady_clock::now());
  peers_.lastCheck = std::chrono::steady_clock::now();
}

void GroupSegment::createSegment(const core::OpContext& ctx) {
  map_.segment = ShmSegment::create("g", geometry_.totalBytes, options_.shmDir, options_.sweepMinAge);
  auto* base = static_cast<char*>(map_.segment.data());
  map_.header = new (base) SegmentHeader();
  map_.header->magic = kSegmentMagic;
  map_.header->buildId = TUNEDIST_BUILD_ID;
  map_.header->version = kProtocolVersion;
  map_.header->worldSize = uint32_t(size_);
  map_.header->slotBytes = options_.slotBytes;
  map_.header->totalBytes = geometry_.totalBytes;
  map_.ctls = reinterpret_cast<RankCtl*>(base + geometry_.ctlOffset);
  for (int p = 0; p < size_; ++p) {
    new (&map_.ctls[p]) RankCtl();
  }
  publishIdentity();
  startHeartbeat();
  // Publish the initialised header, our identity and our held life lock before anybody can count us in.
  map_.header->attached.store(1, std::memory_order_release);
  // Release: abort() on another thread may use the initialised header from now on.
  map_.shared.store(map_.header, std::memory_order_release);
  rendezvous_->set(kSegmentKey, map_.segment.name());
}

void GroupSegment::openSegment(const core::OpContext& ctx) {
  for (;;) {
    checkAttachAbort(ctx);
    if (!rendezvous_->check(kSegmentKey)) {
      if (std::chrono::steady_clock::now() >= ctx.deadline) {
        throw core::TimeoutError(
            core::detail::str("tunedist: ", ctx.name, " (seq ", ctx.seq, ") on rank ", rank_, " of ", size_,
                              ": Timed out waiting for rank 0 to create the group's shared memory; ",
                              "check that rank 0 is alive and calls this collective too."));
      }
      std::this_thread::sleep_for(kAttachPoll);
      continue;
    }
    std::string name = rendezvous_->get(kSegmentKey, remaining(ctx));
    bool notFound = false;
    ShmSegment seg = ShmSegment::open(name, geometry_.totalBytes, &notFound);
    if (seg.valid()) {
      map_.segment = std::move(seg);
      break;
    }
    // A stale name left in the store by an earlier group under the same prefix: wait for the fresh one.
    TD_CHECK(std::chrono::steady_clock::now() < ctx.deadline, "tunedist: ", ctx.name, " (seq ", ctx.seq, ") on rank ",
             rank_, ": shared memory '", name,
             "' announced by rank 0 does not exist. Are all ranks of this group on one host and in one IPC "
             "namespace (containers need --ipc=host)?");
    usleep(10000);
  }
  auto* base = static_cast<char*>(map_.segment.data());
  map_.header = reinterpret_cast<SegmentHeader*>(base);
  TD_CHECK(map_.header->magic == kSegmentMagic && map_.header->version == kProtocolVersion, "tunedist: rank ", rank_,
           ": shared memory ", map_.segment.name(), " has magic ", std::hex, map_.header->magic, " version ", std::dec,
           map_.header->version, ", expected ", std::hex, kSegmentMagic, std::dec, " version ", kProtocolVersion,
           ": ranks run different tunedist versions; install the same build everywhere");
  TD_CHECK(map_.header->buildId == TUNEDIST_BUILD_ID, "tunedist: rank ", rank_, " runs tunedist build ", std::hex,
           TUNEDIST_BUILD_ID, " but rank 0 runs build ", map_.header->buildId, std::dec,
           ": install the same build on every rank");
  TD_CHECK(map_.header->worldSize == uint32_t(size_) && map_.header->slotBytes == options_.slotBytes, "tunedist: rank ",
           rank_, " expects a group of ", size_, " ranks with ", options_.slotBytes, "-byte slots but rank 0 made ",
           map_.header->worldSize, " ranks with ", map_.header->slotBytes,
           "-byte slots: set TUNEDIST_SLOT_BYTES identically on every rank");
  map_.ctls = reinterpret_cast<RankCtl*>(base + geometry_.ctlOffset);
  publishIdentity();
  startHeartbeat();
  // Our identity and our held life lock are visible to anyone who sees the incremented count.
  map_.header->attached.fetch_add(1, std::memory_order_acq_rel);
  // Release: abort() on another thread may use the header from now on.
  map_.shared.store(map_.header, std::memory_order_release);
}

void GroupSegment::checkAttachAbort(const core::OpContext& ctx) {
  if (rendezvous_->check(kAbortKey)) {
    // The value is "<kind digit>|<reason>" (abort() below).
    std::string value = rendezvous_->get(kAbortKey, std::chrono::milliseconds(1000));
    core::FailureKind kind = core::FailureKind::kError;
    if (value.size() >= 2 && value[1] == '|' && value[0] >= '0' && value[0] <= '2') {
      kind = static_cast<core::FailureKind>(value[0] - '0');
      value = value.substr(2);
    }
    fail(ctx, core::detail::str("a peer failed before the group's shared memory was ready: ", value),
         kind == core::FailureKind::kTimeout, kind == core::FailureKind::kPeerDead);
  }
}

void GroupSegment::waitAllAttached(const core::OpContext& ctx) {
  auto lastStoreCheck = std::chrono::steady_clock::now();
  while (map_.header->attached.load(std::memory_order_acquire) < uint32_t(size_)) {
    if (std::chrono::steady_clock::now() - lastStoreCheck >= kAttachPoll) {
      lastStoreCheck = std::chrono::steady_clock::now();
      checkAttachAbort(ctx);
    }
    // abort() ends this wait like every other: a peer's (through the segment) or ours from another thread.
    if (map_.header->abortFlag.load(std::memory_order_acquire) == kAbortSet) {
      failFromPeerAbort(ctx);
    }
    throwIfFailed();
    if (std::chrono::steady_clock::now() >= ctx.deadline) {
      std::ostringstream missing;
      for (int p = 0; p < size_; ++p) {
        if (ctl(p).pid == 0) {
          missing << (missing.tellp() > 0 ? ", " : "") << p;
        }
      }
      throw core::TimeoutError(
          core::detail::str("tunedist: ", ctx.name, " (seq ", ctx.seq, ") on rank ", rank_, " of ", size_,
                            ": Timed out attaching the group's shared memory; ranks [", missing.str(),
                            "] never attached. Check they are alive and call this collective too."));
    }
    usleep(200);
  }
}

void GroupSegment::publishIdentity() {
  const core::ProcessIdentity me = core::ProcessIdentity::self();
  ctl(rank_).pid = me.pid;
  ctl(rank_).pidNamespace = me.pidNamespace;
  ctl(rank_).startTime = me.startTime;
}

// Steps 1 of the life lock (sync.h): initialised here, held by the heartbeat thread, which lives as long as this
// communicator; returns once it is held, so the caller may let peers count this rank in.
void GroupSegment::startHeartbeat() {
  core::LifeLock* life = &ctl(rank_).life;
  core::initLifeLock(life);
  std::promise<void> held;
  std::future<void> isHeld = held.get_future();
  heartbeat_.thread = std::thread([this, life, held = std::move(held)]() mutable {
    try {
      core::holdLifeLock(life);
    } catch (...) {
      held.set_exception(std::current_exception());
      return;
    }
    held.set_value();
    heartbeatLoop();
    core::releaseLifeLock(life);  // step 3: leaving the group
  });
  try {
    isHeld.get();
  } catch (...) {
    heartbeat_.thread.join();
    throw;
  }
}

void GroupSegment::heartbeatLoop() {
  std::unique_lock<std::mutex> lock(heartbeat_.mutex);
  while (!heartbeat_.stop.load()) {
    // Release: a peer that sees the new count knows this process was alive a moment ago.
    ctl(rank_).heartbeat.fetch_add(1, std::memory_order_release);
    heartbeat_.cv.wait_for(lock, options_.heartbeatPeriod, [this] { return heartbeat_.stop.load(); });
  }
}

void GroupSegment::abort(const std::string& reason, core::FailureKind kind) {
  std::string first;
  {
    std::lock_guard<std::mutex> lock(failure_.mutex);
    if (!failure_.failed.load()) {
      failure_.reason = reason;
      failure_.kind = kind;
      failure_.failed.store(true, std::memory_order_release);
    }
    first = failure_.reason;
    kind = failure_.kind;
  }
  // Shared even when we failed earlier: a failure from before the segment was attached reaches the peers now.
  SegmentHeader* header = map_.shared.load(std::memory_order_acquire);
  if (header == nullptr || header->attached.load(std::memory_order_acquire) < uint32_t(size_)) {
    // Peers may still be attaching (or waiting for a segment that will never exist): tell them through the store.
    try {
      rendezvous_->set(kAbortKey, core::detail::str(static_cast<int>(kind), "|rank ", rank_, ": ", first));
    } catch (const std::exception&) {
      // The store is gone (its host process exited); peers then fail on the store themselves.
    }
  }
  // Nobody maps a heap chunk of a failed group again: drop the names now, in case this process is killed next.
  if (listener_ != nullptr) {
    listener_->onAbort();
  }
  if (header == nullptr) {
    return;
  }
  uint32_t expected = 0;
  if (header->abortFlag.compare_exchange_strong(expected, kAbortWriting)) {
    header->abortRank = rank_;
    header->abortKind = static_cast<int32_t>(kind);
    std::strncpy(header->abortReason, first.c_str(), kAbortReasonBytes - 1);
    header->abortReason[kAbortReasonBytes - 1] = '\0';
    // Release: peers that see kAbortSet see the whole reason.
    header->abortFlag.store(kAbortSet, std::memory_order_release);
  }
  header->bell.fetch_add(1);
  core::futexWakeAll(&header->bell);
}

void GroupSegment::throwIfFailed() {
  if (!failure_.failed.load(std::memory_order_acquire)) {
    return;
  }
  std::lock_guard<std::mutex> lock(failure_.mutex);
  core::throwFailure(failure_.kind,
                     core::detail::str("tunedist: rank ", rank_,
                                       ": the process group is unusable after an earlier failure: ", failure_.reason,
                                       " Destroy the group (dist.destroy_process_group) and create a new one, or let "
                                       "torchrun --max-restarts restart the job; if a rank died, the survivors can "
                                       "instead go on with dist.shrink_group(<dead ranks>) and take a replacement in "
                                       "through reconfigure."));
}

void GroupSegment::failFromPeerAbort(const core::OpContext& ctx) {
  const auto kind = static_cast<core::FailureKind>(map_.header->abortKind);
  fail(ctx, core::detail::str("rank ", map_.header->abortRank, " aborted the group: ", map_.header->abortReason),
       kind == core::FailureKind::kTimeout, kind == core::FailureKind::kPeerDead);
}

void GroupSegment::fail(const core::OpContext& ctx, const std::string& message, bool isTimeout, bool isDead) {
  std::string full = core::detail::str("tunedist: ", ctx.name, " (seq ", ctx.seq, ") failed on rank ", rank_, " of ",
                                       size_, ": ", message);
  const core::FailureKind kind = isTimeout ? core::FailureKind::kTimeout
                                           : (isDead ? core::FailureKind::kPeerDead : core::FailureKind::kError);
  abort(full, kind);
  core::throwFailure(kind, full);
}

void GroupSegment::checkPeers(const core::OpContext& ctx, uint64_t step, int stepInOp,
                              const std::vector<int>& waitingFor) {
  if (map_.header->abortFlag.load(std::memory_order_acquire) == kAbortSet) {
    // A peer may have failed in a later operation after the ranks we wait for published (we read their steps
    // before the flag): this operation can still complete, and the next wait for that peer fails.
    for (int p : waitingFor) {
      if (!reached(p, step)) {
        failFromPeerAbort(ctx);
      }
    }
    return;
  }
  auto now = std::chrono::steady_clock::now();
  if (now >= ctx.deadline) {
    std::ostringstream ranks;
    for (size_t i = 0; i < waitingFor.size(); ++i) {
      ranks << (i ? ", " : "") << waitingFor[i];
    }
    fail(ctx,
         core::detail::str("Timed out at step ", stepInOp, " of the operation waiting for ranks [", ranks.str(),
                           "], which are alive but have not reached it. Check that every rank calls the same ",
                           "collectives in the same order, or raise the timeout (init_process_group(timeout=...))."),
         true, false);
  }
  if (now - peers_.lastCheck < kPeerCheckInterval) {
    return;
  }
  peers_.lastCheck = now;
  for (int p : waitingFor) {
    const RankCtl& c = ctl(p);
    uint64_t beat = c.heartbeat.load(std::memory_order_acquire);
    if (beat != peers_.lastBeat[p]) {
      peers_.lastBeat[p] = beat;
      peers_.lastBeatChange[p] = now;
    }
    // The life lock knows exactly (a stopped or frozen process still holds it); the heartbeat counts only where the
    // lock cannot tell, as a last resort.
    const core::Liveness life = core::probeLifeLock(&ctl(p).life);
    core::ProcessIdentity who{c.pid, c.pidNamespace, c.startTime};
    const bool exited = life == core::Liveness::kGone || core::processCertainlyGone(who);
    auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - peers_.lastBeatChange[p]);
    // Read after the probe: a peer that published this step and then left the group (its lock free) is not dead
    // to this wait; the probe's acquire of its released lock makes that publish visible here.
    if (!reached(p, step) && (exited || (life == core::Liveness::kUnknown && silent > options_.deadAfter))) {
      // A pid means something only in its own namespace: say so when the peer's is not ours.
      const bool samePidNs = c.pidNamespace == ctl(rank_).pidNamespace;
      fail(ctx,
           core::detail::str(
               "rank ", p, " (pid ", c.pid, samePidNs ? "" : " in another pid namespace", ") is dead: ",
               exited ? "its process has exited or left the group"
                      : core::detail::str("its heartbeat stopped ", silent.count(), " ms ago"),
               ". This group cannot run operations any more. To keep going, the survivors call "
               "dist.shrink_group([",
               p,
               "]) for a group of the rest (ranks renumbered), and a replacement process "
               "can join them later through reconfigure (dist.distributed_c10d._reconfigure); otherwise restart the "
               "job (torchrun --max-restarts)."),
           false, true);
    }
  }
}

}  // namespace tunedist::shm
