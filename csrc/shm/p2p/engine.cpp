// P2pEngine: the public API, the inbox, the progress thread with its sleep and wake, and shutdown. The work itself
// is in Progress (progress.h): the channels (send_channel.h, recv_channel.h) and the matcher (matcher.h).
//
// Threads: callers only append to the inbox (under mutex_) and ring localBell_. Everything else belongs to the
// progress thread: Progress, the channels, the queued sends, the posted receives and the unexpected messages. A
// small heartbeat thread (heartbeat.h) bumps our heartbeat in every mapped ring, so a long Done callback on the
// progress thread never makes peers think this process died.
//
// The progress thread, step by step:
//   1. Take new operations from the inbox (callers append under mutex_ and ring localBell_).
//   2. One pass (Progress::pass): write queued sends into their rings, read messages out of the rings that
//      somebody here waits for, look up rings not found yet in the rendezvous, and fail operations past their
//      deadline or whose peer is gone.
//   3. If nothing moved: spin for at most kSpinTime (and options.spinIters passes), then yield a few times, then
//      sleep on a futex. The sleep watches
//      localBell_ and the bell of every ring we wait on, so a peer's store to head/tail, an error report or a
//      closed flag wakes us at once; it is bounded by sleepSlice, the nearest deadline and the next rendezvous
//      poll, so timeouts and dead peers are noticed in time.
#include "shm/p2p/engine.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/sync.h"
#include "shm/p2p/context.h"
#include "shm/p2p/heartbeat.h"
#include "shm/p2p/op.h"
#include "shm/p2p/progress.h"

namespace tunedist::shm::p2p {
namespace {

constexpr int kYieldRounds = 16;
// Longest busy poll before yielding: a peer that answers within this saves a futex wake-up (some microseconds).
constexpr std::chrono::microseconds kSpinTime{5};
// Polling period for rings where futex_waitv is unavailable, so a message waits at most about this long.
constexpr std::chrono::milliseconds kFallbackSlice{1};
// With nothing pending the thread only waits for new operations.
constexpr std::chrono::milliseconds kIdleSleep{1000};

// A new operation, checked by the caller.
OpPtr makeOp(bool isSend, int peer, int tag, char* data, size_t bytes, P2pEngine::Clock::time_point deadline,
             P2pEngine::Done done) {
  auto op = std::make_unique<Op>();
  op->isSend = isSend;
  op->peer = peer;
  op->tag = tag;
  op->data = data;
  op->bytes = bytes;
  op->posted = P2pEngine::Clock::now();
  op->deadline = deadline;
  op->done = std::move(done);
  return op;
}

}  // namespace

struct P2pEngine::Impl {
  Impl(std::shared_ptr<core::Rendezvous> rendezvous, int rank, int size, core::ShmOptions options);

  void post(OpPtr op);
  void ensureThreads();  // under mutex_
  void wakeProgress();
  void progressLoop();
  bool intake();
  void sleep(Clock::time_point now);
  void shutdown();

  std::shared_ptr<core::Rendezvous> rendezvous_;
  const int rank_;
  const int size_;
  const core::ShmOptions options_;

  // Caller-facing state, under mutex_.
  std::mutex mutex_;
  std::vector<OpPtr> inbox_;
  bool stopping_ = false;
  std::string abortReason_;
  bool started_ = false;
  std::atomic<bool> inboxPending_{false};
  std::atomic<uint32_t> localBell_{0};
  std::atomic<bool> sleeping_{false};
  std::thread progress_;
  // Set when the engine is destroyed from its own progress thread (in a Done callback): the thread frees it.
  std::unique_ptr<Impl> selfOwned_;

  p2p::Heartbeat heartbeat_;
  p2p::PeerIdentities peers_;
  const p2p::Context ctx_;

  // Progress-thread state.
  p2p::Progress work_;
  std::string aborted_;  // the progress thread's copy of abortReason_
  bool stopRequested_ = false;
  bool waitvSupported_ = true;
};

P2pEngine::P2pEngine(std::shared_ptr<core::Rendezvous> rendezvous, int rank, int size, core::ShmOptions options)
    : impl_(std::make_unique<Impl>(std::move(rendezvous), rank, size, options)) {}

P2pEngine::~P2pEngine() {
  Impl& im = *impl_;
  bool onProgressThread = false;
  {
    std::lock_guard<std::mutex> lock(im.mutex_);
    im.stopping_ = true;
    im.inboxPending_.store(true, std::memory_order_seq_cst);
    onProgressThread = im.started_ && std::this_thread::get_id() == im.progress_.get_id();
  }
  im.wakeProgress();
  if (onProgressThread) {
    // Destroyed from a Done callback: the progress thread cannot join itself. It finishes the shutdown when the
    // callback returns and then frees the state.
    im.progress_.detach();
    im.selfOwned_ = std::move(impl_);
    return;
  }
  if (im.progress_.joinable()) {
    im.progress_.join();
  }
  im.heartbeat_.stop();
}

void P2pEngine::isend(int dst, int tag, const void* data, size_t bytes, Clock::time_point deadline, Done done) {
  const Impl& im = *impl_;
  TD_CHECK(dst >= 0 && dst < im.size_ && dst != im.rank_, "tunedist: send on rank ", im.rank_, ": destination rank ",
           dst, " is invalid for a group of ", im.size_, " ranks (it must be another rank of the group)");
  TD_CHECK(data != nullptr || bytes == 0, "tunedist: send on rank ", im.rank_, " to rank ", dst, ": null buffer for ",
           bytes, " bytes");
  TD_CHECK(done != nullptr, "tunedist: send on rank ", im.rank_, ": no completion callback");
  // const_cast: a send only reads from `data`.
  impl_->post(makeOp(true, dst, tag, static_cast<char*>(const_cast<void*>(data)), bytes, deadline, std::move(done)));
}

void P2pEngine::irecv(int src, int tag, void* data, size_t bytes, Clock::time_point deadline, Done done) {
  const Impl& im = *impl_;
  TD_CHECK(src == -1 || (src >= 0 && src < im.size_ && src != im.rank_), "tunedist: recv on rank ", im.rank_,
           ": source rank ", src, " is invalid for a group of ", im.size_,
           " ranks (it must be another rank of the group, or -1 for any source)");
  TD_CHECK(data != nullptr || bytes == 0, "tunedist: recv on rank ", im.rank_, ": null buffer for ", bytes, " bytes");
  TD_CHECK(done != nullptr, "tunedist: recv on rank ", im.rank_, ": no completion callback");
  impl_->post(makeOp(false, src, tag, static_cast<char*>(data), bytes, deadline, std::move(done)));
}

void P2pEngine::abort(const std::string& reason) {
  Impl& im = *impl_;
  {
    std::lock_guard<std::mutex> lock(im.mutex_);
    if (im.abortReason_.empty()) {
      im.abortReason_ = reason.empty() ? core::detail::str("tunedist: rank ", im.rank_, " aborted point-to-point")
                                       : reason;
    }
    im.inboxPending_.store(true, std::memory_order_seq_cst);
    im.wakeProgress();
  }
}

P2pEngine::Impl::Impl(std::shared_ptr<core::Rendezvous> rendezvous, int rank, int size, core::ShmOptions options)
    : rendezvous_(std::move(rendezvous)),
      rank_(rank),
      size_(size),
      options_(options.forRanks(size)),
      heartbeat_(options_.heartbeatPeriod),
      peers_(rendezvous_.get(), std::max(size, 0)),
      ctx_{rank,
           options_,
           std::max(kCacheLine, options_.p2pChannelBytes / 4 / kCacheLine * kCacheLine),
           rendezvous_.get(),
           &heartbeat_,
           &peers_},
      work_(ctx_, std::max(size, 0)) {
  TD_CHECK(size >= 1 && rank >= 0 && rank < size, "tunedist: invalid rank ", rank, " for group size ", size);
  options_.validate();
  TD_CHECK(rendezvous_ != nullptr, "tunedist: P2pEngine needs a rendezvous");
  // Peers that wait on this rank before it has a ring with them learn of its death through this (peers.h).
  peers_.publish(rank);
}

void P2pEngine::Impl::post(OpPtr op) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_) {
      ensureThreads();
      inbox_.push_back(std::move(op));
      inboxPending_.store(true, std::memory_order_seq_cst);
      // Under the lock: the progress thread cannot see the op (and run a Done that might destroy the engine)
      // before we are done with this object.
      wakeProgress();
      return;
    }
  }
  // Only reachable from a Done callback that runs while the engine shuts down.
  std::string msg = core::detail::str("tunedist: ", p2p::describe(*op, rank_),
                                      " failed: the point-to-point engine is shutting down");
  p2p::fail(std::move(op), p2p::errorOf<core::Error>(msg));
}

void P2pEngine::Impl::ensureThreads() {
  if (started_) {
    return;
  }
  heartbeat_.start();
  try {
    progress_ = std::thread([this] { progressLoop(); });
  } catch (...) {
    heartbeat_.stop();
    throw;
  }
  started_ = true;
}

void P2pEngine::Impl::wakeProgress() {
  // seq_cst pairs with sleep(): either the progress thread sees the new bell value, or we see it sleeping.
  localBell_.fetch_add(1, std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_seq_cst)) {
    core::futexWakeAll(&localBell_);
  }
}

void P2pEngine::Impl::progressLoop() {
  // Idle passes since the last one that moved something, and when that was.
  int idle = 0;
  Clock::time_point idleSince{};
  for (;;) {
    try {
      // Step 1.
      bool moved = intake();
      if (stopRequested_) {
        break;
      }
      Clock::time_point now = Clock::now();
      // Step 2.
      moved = work_.pass(now) || moved;
      if (moved) {
        idle = 0;
        continue;
      }
      // Step 3.
      if (!work_.hasPendingWork()) {
        sleep(now);
        continue;
      }
      if (idle++ == 0) {
        idleSince = now;
      }
      // Spin only briefly: this thread competes with the caller's compute threads for the cores, unlike a
      // collective's waiter, which spins on a thread that would otherwise idle.
      if (idle <= options_.spinIters && now - idleSince < kSpinTime) {
        core::cpuRelax();
      } else if (idle <= options_.spinIters + kYieldRounds) {
        idle = std::max(idle, options_.spinIters + 1);
        sched_yield();
      } else {
        sleep(now);
      }
    } catch (const std::exception& e) {
      // A bug or an allocation failure: nothing here can be trusted any more, so fail everything from now on.
      if (aborted_.empty()) {
        aborted_ = core::detail::str("tunedist: the point-to-point engine on rank ", rank_, " failed: ", e.what());
        work_.failAll(aborted_);
      }
    }
  }
  shutdown();
  if (selfOwned_ != nullptr) {
    heartbeat_.stop();
    std::unique_ptr<Impl> self = std::move(selfOwned_);
    // `self` frees this object on return; nothing may touch a member after this line.
  }
}

bool P2pEngine::Impl::intake() {
  if (!inboxPending_.load(std::memory_order_seq_cst)) {
    return false;
  }
  std::vector<OpPtr> ops;
  std::string abortReason;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ops.swap(inbox_);
    inboxPending_.store(false, std::memory_order_seq_cst);
    abortReason = abortReason_;
    stopRequested_ = stopping_;
  }
  if (!abortReason.empty() && aborted_.empty()) {
    aborted_ = abortReason;
    work_.failAll(aborted_);
  }
  for (OpPtr& op : ops) {
    if (!aborted_.empty()) {
      std::string msg = core::detail::str("tunedist: ", p2p::describe(*op, rank_), " failed: ", aborted_);
      p2p::fail(std::move(op), p2p::errorOf<core::Error>(msg));
    } else {
      work_.post(std::move(op));
    }
  }
  return !ops.empty() || !abortReason.empty();
}

void P2pEngine::Impl::sleep(Clock::time_point now) {
  sleeping_.store(true, std::memory_order_seq_cst);
  {
    BellSet bells(localBell_);
    bool ready = inboxPending_.load(std::memory_order_seq_cst);
    Clock::time_point until = now + (work_.hasPendingWork() ? options_.sleepSlice : kIdleSleep);
    // Register as a sleeper on the rings first, then re-check what the peers may have changed (the Dekker half of
    // P2pRing::notify()).
    ready = ready || work_.watch(bells, &until);
    if (!ready) {
      bells.wait(until, kFallbackSlice, &waitvSupported_);
    }
  }  // unregisters from the rings
  sleeping_.store(false, std::memory_order_seq_cst);
}

void P2pEngine::Impl::shutdown() {
  std::string why = aborted_.empty()
                        ? core::detail::str("the point-to-point engine on rank ", rank_,
                                            " was destroyed (process group destroyed) with the operation pending")
                        : aborted_;
  // Operations posted by Done callbacks while we were stopping are failed too.
  std::vector<OpPtr> late;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    late.swap(inbox_);
  }
  work_.close(why, aborted_.empty(), std::move(late));
}

}  // namespace tunedist::shm::p2p
