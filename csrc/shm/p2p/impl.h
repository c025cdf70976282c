// P2pEngine's private state, shared by p2p.cpp (the public API, the progress thread and its sleep),
// p2p_progress.cpp (the pass, sends), p2p_recv.cpp (receives, matching) and p2p_failure.cpp. Not a public header.
//
// Threads: callers only append to the inbox (under mutex_) and ring localBell_. Everything else belongs to the
// progress thread: the channels, the queued sends, the posted receives and the unexpected messages. A small
// heartbeat thread bumps our heartbeat in every mapped ring (under beatMutex_), so a long Done callback on the
// progress thread never makes peers think this process died.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/store_keys.h"
#include "shm/p2p/engine.h"
#include "shm/p2p/ring.h"

namespace tunedist::shm {

// The rendezvous key under which the sender announces the ring src -> dst.
inline std::string p2pRingKey(int src, int dst) { return keys::p2pRing(src, dst); }

// The error of a failed operation. The exception object's temporary dies in here, before Done runs: a copy freed on
// this thread after Done handed the error on would race (for ThreadSanitizer) with the reader of what().
template <typename E>
std::exception_ptr errorOf(const std::string& message) {
  return std::make_exception_ptr(E(message));
}

struct P2pOp {
  bool isSend = false;
  int peer = -1;  // dst for a send, src for a receive (-1: any source)
  int tag = 0;
  char* data = nullptr;
  size_t bytes = 0;
  P2pEngine::Clock::time_point posted;
  P2pEngine::Clock::time_point deadline;
  P2pEngine::Done done;
  // Sends: span bytes (header + padded payload) already in the ring; 0 until the op starts.
  uint64_t written = 0;
};
using OpPtr = std::unique_ptr<P2pOp>;

// A message that arrived before any receive wanted it, kept on the heap.
struct Unexpected {
  int src = -1;
  int64_t tag = 0;
  size_t bytes = 0;
  std::unique_ptr<char[]> data;
  bool complete = false;
  bool dropped = false;  // taken by a receive of the wrong size: the rest of it is discarded
  OpPtr claimedBy;       // a receive that matched it while it was still streaming in
};

// Messages from one peer (src -> us).
struct InChannel {
  std::unique_ptr<P2pRing> ring;
  uint64_t tail = 0;  // our consumed-bytes cursor (published into the ring)
  // Discovery: polling the rendezvous for the sender's announcement, with a growing interval.
  P2pEngine::Clock::time_point nextPoll{};
  std::chrono::microseconds pollInterval{0};
  std::string staleName;  // an announced name that no longer existed
  P2pEngine::Clock::time_point staleSince{};
  std::string failure;    // set once the channel is unusable (attach error, sender gone); fails its receives
  bool failureIsDead = false;        // fail them with PeerDeadError
  bool failureFailsAnySource = false;  // the sender died (not closed cleanly): any-source receives fail too
  // The message being consumed.
  bool inMessage = false;
  P2pMsgHeader message{};
  uint64_t consumed = 0;  // padded payload bytes consumed so far
  enum class Dest { kReceive, kUnexpected, kDiscard } dest = Dest::kDiscard;
  OpPtr receive;
  std::list<Unexpected>::iterator unexpected;
  uint64_t nextSeq = 1;
};

// Messages to one peer (us -> dst), sent in order.
struct OutChannel {
  std::unique_ptr<P2pRing> ring;
  uint64_t head = 0;  // our written-bytes cursor (published into the ring)
  uint64_t nextSeq = 1;
  std::deque<OpPtr> queue;
  std::string peerError;  // the receiver's report, for the next send that starts
  std::string failure;    // set once the channel is unusable (a send failed half-written, peer gone)
  bool failureIsDead = false;
};

struct P2pEngine::Impl {
  Impl(std::shared_ptr<Rendezvous> rendezvous, int rank, int size, ShmOptions options);

  // p2p.cpp: posting, the threads, sleeping, shutting down.
  void post(OpPtr op);
  void ensureThreads();  // under mutex_
  void progressLoop();
  void heartbeatLoop();
  bool intake();
  void sleep(Clock::time_point now);
  void shutdown();
  void linger(const std::vector<P2pRing*>& rings);
  void wakeProgress();
  void stopHeartbeat();

  // p2p_progress.cpp: one pass of work and the failure paths.
  bool pass(Clock::time_point now);
  bool pumpSends(Clock::time_point now);
  bool pumpSend(int dst, OutChannel& ch);
  bool createOutRing(int dst, OutChannel& ch);
  bool pumpReceives();
  bool pumpReceive(int src, InChannel& ch);
  bool startMessage(int src, InChannel& ch);
  void finishMessage(int src, InChannel& ch);
  bool discover(Clock::time_point now);
  void postReceive(OpPtr op);
  void postSend(OpPtr op);
  bool takeUnexpected(OpPtr& op);
  void checkDeadlines(Clock::time_point now);
  void checkPeers(Clock::time_point now);
  void failInChannel(int src, InChannel& ch, const std::string& why, bool dead, bool anySourceToo);
  void failOutChannel(int dst, OutChannel& ch, const std::string& why, bool dead);
  void failAll(const std::string& reason);
  void reportToSender(InChannel& ch, const std::string& text);
  std::string sizeMismatch(const P2pOp& op, int src, int64_t tag, size_t sentBytes) const;
  void updateWanted();
  bool hasPendingWork() const;
  bool canWrite(const OutChannel& ch) const;
  Clock::time_point earliestDeadline() const;
  void addBeat(P2pRing& ring);

  // Completion (on the progress thread, never under a lock).
  void complete(OpPtr op, int srcRank);
  void fail(OpPtr op, std::exception_ptr error);
  std::string describe(const P2pOp& op) const;
  std::exception_ptr opError(const P2pOp& op, const std::string& why, bool dead) const;
  std::exception_ptr timeoutError(const P2pOp& op, const std::string& why) const;
  std::string receiveStall(const P2pOp& op) const;

  std::shared_ptr<Rendezvous> rendezvous_;
  const int rank_;
  const int size_;
  const ShmOptions options_;
  const size_t chunkBytes_;

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

  // Heartbeat thread.
  std::mutex beatMutex_;
  std::condition_variable beatCv_;
  bool stopBeat_ = false;
  std::vector<std::atomic<uint64_t>*> beats_;
  std::thread heartbeat_;

  // Progress-thread state.
  std::vector<InChannel> in_;
  std::vector<OutChannel> out_;
  std::list<OpPtr> posted_;  // receives waiting for a message, in posting order
  std::list<Unexpected> unexpected_;
  std::string aborted_;  // the progress thread's copy of abortReason_
  bool stopRequested_ = false;
  std::vector<char> want_;  // want_[src]: a posted receive could take src's next message (updateWanted)
  Clock::time_point nextPeerCheck_{};
  size_t discoverCursor_ = 0;
  bool waitvSupported_ = true;
};

}  // namespace tunedist::shm
