// The round protocol shared by every collective: publish a step, wait for peers' steps, double-buffer reuse,
// descriptor comparison, and the liveness checks made while waiting.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "core/sync.h"
#include "shm/comm.h"

namespace tunedist::shm {
namespace {

constexpr int kYieldRounds = 16;
constexpr std::chrono::milliseconds kPeerCheckInterval{10};

std::string describe(const OpDesc& d) {
  std::ostringstream os;
  if (!d.valid) {
    return "(no operation)";
  }
  os << opCodeName(OpCode(d.opcode)) << " seq " << d.seq;
  if (d.count != 0 || OpCode(d.opcode) != OpCode::kAlltoall) {
    os << ", count " << d.count;
  }
  switch (OpCode(d.opcode)) {
    case OpCode::kAllreduce:
    case OpCode::kReduce:
    case OpCode::kReduceScatter: {
      double f = 0;
      std::memcpy(&f, &d.factorBits, sizeof(f));
      os << ", " << dtypeName(DType(d.dtype)) << ", " << redOpName(RedOp(d.redop));
      if (RedOp(d.redop) == RedOp::kPremulSum) {
        os << "(" << f << ")";
      }
      break;
    }
    default: break;
  }
  if (d.root >= 0) {
    os << ", root " << d.root;
  }
  return os.str();
}

bool sameDesc(const OpDesc& a, const OpDesc& b) {
  return a.valid == b.valid && a.opcode == b.opcode && a.seq == b.seq && a.count == b.count && a.dtype == b.dtype &&
         a.redop == b.redop && a.root == b.root && a.factorBits == b.factorBits;
}

}  // namespace

uint64_t ShmComm::publish(const OpContext& ctx) {
  ++stepInOp_;
  if (stall_.rank == rank_ && stall_.seq == opSeq_ && stall_.step == stepInOp_) {
    usleep(useconds_t(stall_.stallMs) * 1000);
  }
  ++step_;
  // Release: our slot writes for this step (and the descriptor) are visible to whoever sees `step_`.
  // seq_cst pairs with the sleepers check below against a waiter that is going to sleep (see waitAll).
  ctl(rank_).step.store(step_, std::memory_order_seq_cst);
  if (header_->sleepers.load(std::memory_order_seq_cst) > 0) {
    header_->bell.fetch_add(1, std::memory_order_seq_cst);
    futexWakeAll(&header_->bell);
  }
  return step_;
}

void ShmComm::waitUntilAll(const OpContext& ctx, uint64_t step) {
  auto allReady = [&] {
    for (int p = 0; p < size_; ++p) {
      if (!reached(p, step)) {
        return false;
      }
    }
    return true;
  };
  bool done = false;
  for (int i = 0; i < options_.spinIters && !(done = allReady()); ++i) {
    cpuRelax();
  }
  for (int i = 0; i < kYieldRounds && !done; ++i) {
    sched_yield();
    done = allReady();
  }
  std::vector<int> waitingFor;
  while (!done) {
    header_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    uint32_t seen = header_->bell.load(std::memory_order_seq_cst);
    waitingFor.clear();
    for (int p = 0; p < size_; ++p) {
      if (!reached(p, step)) {
        waitingFor.push_back(p);
      }
    }
    if (waitingFor.empty()) {
      header_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
      break;
    }
    try {
      checkPeers(ctx, step, waitingFor);
    } catch (...) {
      header_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
      throw;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(ctx.deadline - std::chrono::steady_clock::now());
    futexWait(&header_->bell, seen, std::max(std::chrono::milliseconds(1), std::min(options_.sleepSlice, left)));
    header_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
  if (descPending_) {
    descPending_ = false;
    checkDescs(ctx, descBuffer_);
  }
}

void ShmComm::checkPeers(const OpContext& ctx, uint64_t step, const std::vector<int>& waitingFor) {
  if (header_->abortFlag.load(std::memory_order_acquire) == kAbortSet) {
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
         detail::str("Timed out at step ", stepInOp_, " of the operation waiting for ranks [", ranks.str(),
                     "], which are alive but have not reached it. Check that every rank calls the same ",
                     "collectives in the same order, or raise the timeout (init_process_group(timeout=...))."),
         true, false);
  }
  if (now - lastPeerCheck_ < kPeerCheckInterval) {
    return;
  }
  lastPeerCheck_ = now;
  for (int p : waitingFor) {
    const RankCtl& c = ctl(p);
    uint64_t beat = c.heartbeat.load(std::memory_order_acquire);
    if (beat != lastBeat_[p]) {
      lastBeat_[p] = beat;
      lastBeatChange_[p] = now;
    }
    // The life lock knows exactly (a stopped or frozen process still holds it); the heartbeat counts only where the
    // lock cannot tell, as a last resort.
    const Liveness life = probeLifeLock(&ctl(p).life);
    ProcessIdentity who{c.pid, c.pidNamespace, c.startTime};
    const bool exited = life == Liveness::kGone || processCertainlyGone(who);
    auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - lastBeatChange_[p]);
    // Read after the probe: a peer that published this step and then left the group (its lock free) is not dead
    // to this wait; the probe's acquire of its released lock makes that publish visible here.
    if (!reached(p, step) && (exited || (life == Liveness::kUnknown && silent > options_.deadAfter))) {
      // A pid means something only in its own namespace: say so when the peer's is not ours.
      const bool samePidNs = c.pidNamespace == ctl(rank_).pidNamespace;
      fail(ctx,
           detail::str("rank ", p, " (pid ", c.pid, samePidNs ? "" : " in another pid namespace", ") is dead: ",
                       exited ? "its process has exited or left the group"
                              : detail::str("its heartbeat stopped ", silent.count(), " ms ago"),
                       ". The group is unusable; restart the job (torchrun --max-restarts) or create a new group."),
           false, true);
    }
  }
}

void ShmComm::acquireBuffer(const OpContext& ctx, int buffer) {
  if (releaseStep_[buffer] > 0) {
    // Wait until every peer has moved past its last read of our previous contents of this buffer.
    bool pending = descPending_;
    descPending_ = false;
    waitAll(ctx, releaseStep_[buffer]);
    descPending_ = pending;
  }
}

ShmComm::RoundStores::RoundStores(ShmComm& comm, RoundFamily family, size_t bytes, bool active) : comm_(comm) {
  // Under kMinBytes the chooser has nothing to time: the caller's own stores apply (SlotCopyIn's are cached there).
  if (!active || comm.options_.slotStores != SlotStores::kAuto || bytes < RoundStoreChooser::kMinBytes) {
    return;
  }
  RoundStoreChooser& chooser = comm.roundChoosers_[family];
  const int cls = RoundStoreChooser::classOf(bytes);
  if (chooser.verdictDue(cls)) {
    // Every rank that closed the window with us published its medians before the step we have since waited for.
    // The slowest rank's work in each mode decides: back to back, an operation can start no faster than its
    // busiest rank ends the previous one (a broadcast's root and readers do different work).
    double cached = 0;
    double streaming = 0;
    for (int p = 0; p < comm.size_; ++p) {
      const RoundVerdict& v = comm.ctl(p).verdicts[family][cls];
      const float c = v.cachedNsPerByte.load(std::memory_order_relaxed);
      const float s = v.streamingNsPerByte.load(std::memory_order_relaxed);
      // A rank with forced stores, or one that missed a mode's samples, shares nothing for this window.
      if (v.window.load(std::memory_order_relaxed) == chooser.windows(cls) && c > 0 && s > 0) {
        cached = std::max(cached, double(c));
        streaming = std::max(streaming, double(s));
      }
    }
    chooser.decide(cls, cached, streaming);
  }
  const RoundStoreChooser::Plan plan = chooser.next(bytes);
  family_ = &chooser;
  cls_ = cls;
  if (chooser.probeWanted(cls) && comm.stepInOp_ == 0) {
    // Our descriptor of this operation carries the ask; the first publish releases it (all_to_all, which publishes its
    // sizes before it knows its class, cannot ask: it waits for its next scheduled window).
    comm.ctl(comm.rank_).desc[comm.descBuffer_].probeRequest = 1;
  }
  if (plan.windowClosed) {
    // Published by this operation's first step (release); read by the peers at their next operation of the class.
    RoundVerdict& mine = comm.ctl(comm.rank_).verdicts[family][cls];
    mine.cachedNsPerByte.store(float(chooser.lastCachedNsPerByte(cls)), std::memory_order_relaxed);
    mine.streamingNsPerByte.store(float(chooser.lastStreamingNsPerByte(cls)), std::memory_order_relaxed);
    mine.window.store(chooser.windows(cls), std::memory_order_relaxed);
  }
  comm.roundStreaming_ = plan.streaming ? 1 : 0;
  if (plan.timed) {
    chooser_ = &chooser;
    bytes_ = bytes;
    comm.timingWaits_ = true;
    comm.waited_ = std::chrono::nanoseconds(0);
    start_ = std::chrono::steady_clock::now();
  }
}

void ShmComm::RoundStores::done() {
  if (family_ != nullptr && comm_.groupProbeRequest_) {
    // Every rank read the same descriptors of this operation: all start the window at the class's next operation.
    family_->startWindowNext(cls_);
    family_ = nullptr;
  }
  if (chooser_ != nullptr) {
    const auto work = std::chrono::steady_clock::now() - start_ - comm_.waited_;
    chooser_->record(double(std::chrono::duration_cast<std::chrono::nanoseconds>(work).count()) / double(bytes_));
    chooser_ = nullptr;
    comm_.timingWaits_ = false;
  }
}

void ShmComm::syncRound(const OpContext& ctx) {
  int b = beginRound(ctx);
  waitAll(ctx, publish(ctx));
  releaseBuffer(b);
}

void ShmComm::releaseBuffer(int buffer) {
  // Each rank reads a round's slots before it publishes again, so step_ + 1 marks everybody done with `buffer`.
  releaseStep_[buffer] = step_ + 1;
}

int ShmComm::beginRound(const OpContext& ctx) {
  int b = buffer_;
  acquireBuffer(ctx, b);
  buffer_ ^= 1;
  return b;
}

void ShmComm::writeDesc(int buffer, const OpDesc& desc) {
  OpDesc d = desc;
  d.valid = 1;
  d.probeRequest = 0;
  // Plain store: the first publish of this operation releases it.
  ctl(rank_).desc[buffer] = d;
  descPending_ = true;
  descBuffer_ = buffer;
}

void ShmComm::checkDescs(const OpContext& ctx, int buffer) {
  const OpDesc& mine = ctl(rank_).desc[buffer];
  bool same = true;
  for (int p = 0; p < size_ && same; ++p) {
    same = sameDesc(ctl(p).desc[buffer], mine);
  }
  if (same) {
    int symmetric = 0;
    for (int p = 0; p < size_; ++p) {
      symmetric += ctl(p).desc[buffer].symmetric;
      groupProbeRequest_ = groupProbeRequest_ || ctl(p).desc[buffer].probeRequest != 0;
    }
    if (symmetric != 0 && symmetric != size_) {
      // Some ranks run the zero-copy algorithm and some the copying one: every rank sees the same descriptors, so
      // every rank restarts the operation on the copying path (runOp).
      throw RestartOnCopyPath{};
    }
    return;
  }
  std::ostringstream os;
  os << "ranks disagree on the operation: ";
  for (int p = 0; p < size_; ++p) {
    os << (p ? "; " : "") << "rank " << p << " called " << describe(ctl(p).desc[buffer]);
  }
  os << ". Every rank must call the same collectives in the same order with matching sizes, dtypes, ops and roots.";
  fail(ctx, os.str(), false, false);
}

}  // namespace tunedist::shm
