// The round protocol shared by every collective: publish a step, wait for peers' steps, double-buffer reuse, and
// the descriptor comparison (with the zero-copy vote) at an operation's first wait.
#include "shm/rounds.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/env.h"
#include "core/sync.h"

namespace tunedist::shm {
namespace {

constexpr int kYieldRounds = 16;

}  // namespace

StallPoint StallPoint::fromEnv() {
  StallPoint s;
  if (auto v = core::envString("TUNEDIST_TEST_STALL")) {
    unsigned long long seq = 0;
    int n = std::sscanf(v->c_str(), "%d:%llu:%d:%d", &s.rank, &seq, &s.step, &s.stallMs);
    TD_CHECK(n == 4, "tunedist: TUNEDIST_TEST_STALL='", *v, "' must be rank:seq:step:milliseconds");
    s.seq = seq;
  }
  return s;
}

Rounds::Rounds(std::shared_ptr<core::Rendezvous> rendezvous, int rank, int size, const core::ShmOptions& options)
    : segment_(std::move(rendezvous), rank, size, options),
      policy_(segment_.options()),
      stall_(StallPoint::fromEnv()) {}

size_t Rounds::sliceElems(size_t count, size_t elemSize) const {
  // Largest 64-byte-aligned slice such that size() of them fit a slot, and no larger than needed for `count`.
  size_t maxSliceBytes = slotPartBytes();
  size_t perRank = (count + size_t(size()) - 1) / size_t(size());
  size_t wantBytes = roundUp(perRank * elemSize, kCacheLine);
  size_t sliceBytes = std::min(maxSliceBytes, std::max(wantBytes, kCacheLine));
  return sliceBytes / elemSize;
}

void Rounds::startOp(const core::OpContext& ctx, const OpDesc& desc) {
  segment_.attach(ctx);
  opSeq_ = ctx.seq;
  stepInOp_ = 0;
  groupProbeRequest_ = false;
  // The descriptor travels in the first round's buffer; taking the buffer first keeps a slow peer's view of the
  // previous operation's descriptor intact.
  acquireBuffer(ctx, buffer_);
  OpDesc d = desc;
  d.valid = 1;
  d.probeRequest = 0;
  // Plain store: the first publish of this operation releases it.
  segment_.ctl(rank()).desc[buffer_] = d;
  descPending_ = true;
  descBuffer_ = buffer_;
}

uint64_t Rounds::publish(const core::OpContext& ctx) {
  ++stepInOp_;
  if (stall_.rank == rank() && stall_.seq == opSeq_ && stall_.step == stepInOp_) {
    usleep(useconds_t(stall_.stallMs) * 1000);
  }
  ++step_;
  SegmentHeader& header = segment_.header();
  // Release: our slot writes for this step (and the descriptor) are visible to whoever sees `step_`.
  // seq_cst pairs with the sleepers check below against a waiter that is going to sleep (see waitAll).
  segment_.ctl(rank()).step.store(step_, std::memory_order_seq_cst);
  if (header.sleepers.load(std::memory_order_seq_cst) > 0) {
    header.bell.fetch_add(1, std::memory_order_seq_cst);
    core::futexWakeAll(&header.bell);
  }
  return step_;
}

void Rounds::waitUntilAll(const core::OpContext& ctx, uint64_t step) {
  const int size = this->size();
  auto reached = [&](int p) { return segment_.ctl(p).step.load(std::memory_order_acquire) >= step; };
  auto allReady = [&] {
    for (int p = 0; p < size; ++p) {
      if (!reached(p)) {
        return false;
      }
    }
    return true;
  };
  bool done = false;
  for (int i = 0; i < options().spinIters && !(done = allReady()); ++i) {
    core::cpuRelax();
  }
  for (int i = 0; i < kYieldRounds && !done; ++i) {
    sched_yield();
    done = allReady();
  }
  SegmentHeader& header = segment_.header();
  std::vector<int> waitingFor;
  while (!done) {
    header.sleepers.fetch_add(1, std::memory_order_seq_cst);
    uint32_t seen = header.bell.load(std::memory_order_seq_cst);
    waitingFor.clear();
    for (int p = 0; p < size; ++p) {
      if (!reached(p)) {
        waitingFor.push_back(p);
      }
    }
    if (waitingFor.empty()) {
      header.sleepers.fetch_sub(1, std::memory_order_seq_cst);
      break;
    }
    try {
      segment_.checkPeers(ctx, step, stepInOp_, waitingFor);
    } catch (...) {
      header.sleepers.fetch_sub(1, std::memory_order_seq_cst);
      throw;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(ctx.deadline - std::chrono::steady_clock::now());
    core::futexWait(&header.bell, seen, std::max(std::chrono::milliseconds(1), std::min(options().sleepSlice, left)));
    header.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
  if (descPending_) {
    descPending_ = false;
    checkDescs(ctx, descBuffer_);
  }
}

void Rounds::acquireBuffer(const core::OpContext& ctx, int buffer) {
  if (releaseStep_[buffer] > 0) {
    // Wait until every peer has moved past its last read of our previous contents of this buffer.
    bool pending = descPending_;
    descPending_ = false;
    waitAll(ctx, releaseStep_[buffer]);
    descPending_ = pending;
  }
}

void Rounds::syncRound(const core::OpContext& ctx) {
  int b = beginRound(ctx);
  waitAll(ctx, publish(ctx));
  releaseBuffer(b);
}

int Rounds::beginRound(const core::OpContext& ctx) {
  int b = buffer_;
  acquireBuffer(ctx, b);
  buffer_ ^= 1;
  return b;
}

void Rounds::checkDescs(const core::OpContext& ctx, int buffer) {
  const int size = this->size();
  const OpDesc& mine = segment_.ctl(rank()).desc[buffer];
  bool same = true;
  for (int p = 0; p < size && same; ++p) {
    same = sameDesc(segment_.ctl(p).desc[buffer], mine);
  }
  if (same) {
    int symmetric = 0;
    for (int p = 0; p < size; ++p) {
      symmetric += segment_.ctl(p).desc[buffer].symmetric;
      groupProbeRequest_ = groupProbeRequest_ || segment_.ctl(p).desc[buffer].probeRequest != 0;
    }
    if (symmetric != 0 && symmetric != size) {
      // Some ranks run the zero-copy algorithm and some the copying one: every rank sees the same descriptors, so
      // every rank restarts the operation on the copying path (run).
      throw RestartOnCopyPath{};
    }
    return;
  }
  std::ostringstream os;
  os << "ranks disagree on the operation: ";
  for (int p = 0; p < size; ++p) {
    os << (p ? "; " : "") << "rank " << p << " called " << describeDesc(segment_.ctl(p).desc[buffer]);
  }
  os << ". Every rank must call the same collectives in the same order with matching sizes, dtypes, ops and roots.";
  segment_.fail(ctx, os.str(), false, false);
}

}  // namespace tunedist::shm
