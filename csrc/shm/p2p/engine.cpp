// P2pEngine: the public API, the progress and heartbeat threads, how the progress thread sleeps, and shutdown.
// The work of one progress pass is in p2p_progress.cpp (sends), p2p_recv.cpp (receives) and p2p_failure.cpp.
//
// The progress thread, step by step:
//   1. Take new operations from the inbox (callers append under mutex_ and ring localBell_).
//   2. One pass: write queued sends into their rings, read messages out of the rings that somebody here waits
//      for, look up rings not found yet in the rendezvous, and fail operations past their deadline or whose
//      peer is gone.
//   3. If nothing moved: spin for at most kSpinTime (and options.spinIters passes), then yield a few times, then
//      sleep on a futex. The sleep watches
//      localBell_ and the bell of every ring we wait on, so a peer's store to head/tail, an error report or a
//      closed flag wakes us at once; it is bounded by sleepSlice, the nearest deadline and the next rendezvous
//      poll, so timeouts and dead peers are noticed in time.
#include "shm/p2p/engine.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

#include "core/error.h"
#include "shm/p2p/impl.h"
#include "core/sync.h"

namespace tunedist::shm {
namespace {

constexpr int kYieldRounds = 16;
// Longest busy poll before yielding: a peer that answers within this saves a futex wake-up (some microseconds).
constexpr std::chrono::microseconds kSpinTime{5};
// Polling period for rings where futex_waitv is unavailable, so a message waits at most about this long.
constexpr std::chrono::milliseconds kFallbackSlice{1};
// With nothing pending the thread only waits for new operations.
constexpr std::chrono::milliseconds kIdleSleep{1000};
// How long a destroyed engine waits for receivers to map rings that still hold messages they have not seen.
constexpr std::chrono::milliseconds kLinger{3000};

}  // namespace

P2pEngine::P2pEngine(std::shared_ptr<Rendezvous> rendezvous, int rank, int size, ShmOptions options)
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
  im.stopHeartbeat();
}

void P2pEngine::isend(int dst, int tag, const void* data, size_t bytes, Clock::time_point deadline, Done done) {
  const Impl& im = *impl_;
  TD_CHECK(dst >= 0 && dst < im.size_ && dst != im.rank_, "tunedist: send on rank ", im.rank_, ": destination rank ",
           dst, " is invalid for a group of ", im.size_, " ranks (it must be another rank of the group)");
  TD_CHECK(data != nullptr || bytes == 0, "tunedist: send on rank ", im.rank_, " to rank ", dst,
           ": null buffer for ", bytes, " bytes");
  TD_CHECK(done != nullptr, "tunedist: send on rank ", im.rank_, ": no completion callback");
  auto op = std::make_unique<P2pOp>();
  op->isSend = true;
  op->peer = dst;
  op->tag = tag;
  op->data = static_cast<char*>(const_cast<void*>(data));  // only read from
  op->bytes = bytes;
  op->posted = Clock::now();
  op->deadline = deadline;
  op->done = std::move(done);
  impl_->post(std::move(op));
}

void P2pEngine::irecv(int src, int tag, void* data, size_t bytes, Clock::time_point deadline, Done done) {
  const Impl& im = *impl_;
  TD_CHECK(src == -1 || (src >= 0 && src < im.size_ && src != im.rank_), "tunedist: recv on rank ", im.rank_,
           ": source rank ", src, " is invalid for a group of ", im.size_,
           " ranks (it must be another rank of the group, or -1 for any source)");
  TD_CHECK(data != nullptr || bytes == 0, "tunedist: recv on rank ", im.rank_, ": null buffer for ", bytes,
           " bytes");
  TD_CHECK(done != nullptr, "tunedist: recv on rank ", im.rank_, ": no completion callback");
  auto op = std::make_unique<P2pOp>();
  op->peer = src;
  op->tag = tag;
  op->data = static_cast<char*>(data);
  op->bytes = bytes;
  op->posted = Clock::now();
  op->deadline = deadline;
  op->done = std::move(done);
  impl_->post(std::move(op));
}

void P2pEngine::abort(const std::string& reason) {
  Impl& im = *impl_;
  {
    std::lock_guard<std::mutex> lock(im.mutex_);
    if (im.abortReason_.empty()) {
      im.abortReason_ = reason.empty() ? detail::str("tunedist: rank ", im.rank_, " aborted point-to-point") : reason;
    }
    im.inboxPending_.store(true, std::memory_order_seq_cst);
    im.wakeProgress();
  }
}

P2pEngine::Impl::Impl(std::shared_ptr<Rendezvous> rendezvous, int rank, int size, ShmOptions options)
    : rendezvous_(std::move(rendezvous)),
      rank_(rank),
      size_(size),
      options_(options),
      chunkBytes_(std::max(kCacheLine, options.p2pChannelBytes / 4 / kCacheLine * kCacheLine)),
      in_(size_t(std::max(size, 0))),
      out_(size_t(std::max(size, 0))),
      want_(size_t(std::max(size, 0)), 0) {
  TD_CHECK(size >= 1 && rank >= 0 && rank < size, "tunedist: invalid rank ", rank, " for group size ", size);
  options_.validate();
  TD_CHECK(rendezvous_ != nullptr, "tunedist: P2pEngine needs a rendezvous");
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
  std::string msg = detail::str("tunedist: ", describe(*op), " failed: the point-to-point engine is shutting down");
  fail(std::move(op), errorOf<Error>(msg));
}

void P2pEngine::Impl::ensureThreads() {
  if (started_) {
    return;
  }
  stopBeat_ = false;
  heartbeat_ = std::thread([this] { heartbeatLoop(); });
  try {
    progress_ = std::thread([this] { progressLoop(); });
  } catch (...) {
    stopHeartbeat();
    throw;
  }
  started_ = true;
}

void P2pEngine::Impl::wakeProgress() {
  // seq_cst pairs with sleep(): either the progress thread sees the new bell value, or we see it sleeping.
  localBell_.fetch_add(1, std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_seq_cst)) {
    futexWakeAll(&localBell_);
  }
}

void P2pEngine::Impl::progressLoop() {
  // Idle passes since the last one that moved something, and when that was.
  int idle = 0;
  Clock::time_point idleSince{};
  for (;;) {
    try {
      bool moved = intake();
      if (stopRequested_) {
        break;
      }
      Clock::time_point now = Clock::now();
      moved = pass(now) || moved;
      if (moved) {
        idle = 0;
        continue;
      }
      if (!hasPendingWork()) {
        sleep(now);
        continue;
      }
      if (idle++ == 0) {
        idleSince = now;
      }
      // Spin only briefly: this thread competes with the caller's compute threads for the cores, unlike a
      // collective's waiter, which spins on a thread that would otherwise idle.
      if (idle <= options_.spinIters && now - idleSince < kSpinTime) {
        cpuRelax();
      } else if (idle <= options_.spinIters + kYieldRounds) {
        idle = std::max(idle, options_.spinIters + 1);
        sched_yield();
      } else {
        sleep(now);
      }
    } catch (const std::exception& e) {
      // A bug or an allocation failure: nothing here can be trusted any more, so fail everything from now on.
      if (aborted_.empty()) {
        aborted_ = detail::str("tunedist: the point-to-point engine on rank ", rank_, " failed: ", e.what());
        failAll(aborted_);
      }
    }
  }
  shutdown();
  if (selfOwned_ != nullptr) {
    stopHeartbeat();
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
    failAll(aborted_);
  }
  for (OpPtr& op : ops) {
    if (!aborted_.empty()) {
      std::string msg = detail::str("tunedist: ", describe(*op), " failed: ", aborted_);
      fail(std::move(op), errorOf<Error>(msg));
    } else if (op->isSend) {
      postSend(std::move(op));
    } else {
      postReceive(std::move(op));
    }
  }
  return !ops.empty() || !abortReason.empty();
}

void P2pEngine::Impl::sleep(Clock::time_point now) {
  std::vector<std::pair<std::atomic<uint32_t>*, uint32_t>> words;
  std::vector<P2pRing*> rings;
  sleeping_.store(true, std::memory_order_seq_cst);
  words.emplace_back(&localBell_, localBell_.load(std::memory_order_seq_cst));
  bool ready = inboxPending_.load(std::memory_order_seq_cst);
  Clock::time_point until = now + (hasPendingWork() ? options_.sleepSlice : kIdleSleep);
  auto watch = [&](P2pRing& ring) {
    P2pRingHeader& h = ring.header();
    h.sleepers.fetch_add(1, std::memory_order_seq_cst);
    rings.push_back(&ring);
    words.emplace_back(&h.bell, h.bell.load(std::memory_order_seq_cst));
  };
  // Register as a sleeper first, then re-check what the peer may have changed (the Dekker half of notify()).
  for (size_t dst = 0; dst < out_.size() && !ready; ++dst) {
    OutChannel& ch = out_[dst];
    if (ch.ring != nullptr && !ch.queue.empty()) {
      watch(*ch.ring);
      ready = canWrite(ch) || ch.ring->header().errorState.load(std::memory_order_seq_cst) != 0 ||
              ch.ring->header().receiverClosed.load(std::memory_order_seq_cst) != 0;
    }
  }
  for (size_t src = 0; src < in_.size() && !ready; ++src) {
    InChannel& ch = in_[src];
    if (ch.ring == nullptr || !ch.failure.empty()) {
      if (ch.ring == nullptr && ch.failure.empty() && want_[src]) {
        until = std::min(until, ch.nextPoll);
      }
      continue;
    }
    if (ch.inMessage || want_[src]) {
      watch(*ch.ring);
      ready = ch.ring->header().head.load(std::memory_order_seq_cst) != ch.tail;
    }
  }
  until = std::min(until, earliestDeadline());
  if (rings.size() > 0) {
    until = std::min(until, nextPeerCheck_);
  }
  if (!ready) {
    futexWaitAny(words, until, kFallbackSlice, &waitvSupported_);
  }
  for (P2pRing* ring : rings) {
    ring->header().sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
  sleeping_.store(false, std::memory_order_seq_cst);
}

void P2pEngine::Impl::heartbeatLoop() {
  std::unique_lock<std::mutex> lock(beatMutex_);
  while (!stopBeat_) {
    for (std::atomic<uint64_t>* beat : beats_) {
      // Release: a peer that sees the new count knows this process was alive a moment ago.
      beat->fetch_add(1, std::memory_order_release);
    }
    beatCv_.wait_for(lock, options_.heartbeatPeriod, [this] { return stopBeat_; });
  }
}

void P2pEngine::Impl::addBeat(P2pRing& ring) {
  std::lock_guard<std::mutex> lock(beatMutex_);
  ring.ownBeat().fetch_add(1, std::memory_order_release);
  beats_.push_back(&ring.ownBeat());
}

void P2pEngine::Impl::stopHeartbeat() {
  {
    std::lock_guard<std::mutex> lock(beatMutex_);
    stopBeat_ = true;
  }
  beatCv_.notify_all();
  if (heartbeat_.joinable()) {
    heartbeat_.join();
  }
}

void P2pEngine::Impl::shutdown() {
  std::string why = aborted_.empty()
                        ? detail::str("the point-to-point engine on rank ", rank_,
                                      " was destroyed (process group destroyed) with the operation pending")
                        : aborted_;
  // Operations posted by Done callbacks while we were stopping are failed too.
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (OpPtr& op : inbox_) {
      posted_.push_back(std::move(op));
    }
    inbox_.clear();
  }
  // Rings that hold complete messages their receiver has not seen (not those of a failed channel: what is in
  // them can never be finished).
  std::vector<P2pRing*> unseen;
  for (OutChannel& ch : out_) {
    if (aborted_.empty() && ch.ring != nullptr && ch.failure.empty() && ch.head > 0) {
      unseen.push_back(ch.ring.get());
    }
  }
  failAll(why);
  linger(unseen);
}

void P2pEngine::Impl::linger(const std::vector<P2pRing*>& rings) {
  // A send completes once its bytes are in the ring, so a receiver that has not mapped the ring yet would lose
  // them when we unlink the name. Give such receivers a moment (bounded: a receiver may never come).
  Clock::time_point until = Clock::now() + kLinger;
  for (;;) {
    bool waiting = false;
    for (P2pRing* ring : rings) {
      const P2pRingHeader& h = ring->header();
      waiting = waiting || (h.receiverAttached.load(std::memory_order_acquire) == 0 &&
                            h.receiverClosed.load(std::memory_order_acquire) == 0);
    }
    if (!waiting || Clock::now() >= until) {
      return;
    }
    usleep(1000);
  }
}

}  // namespace tunedist::shm
