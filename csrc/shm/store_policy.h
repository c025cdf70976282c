// StorePolicy: how a rank copies data into its own slot, cached or streaming stores, for every collective. Each
// collective family has a RoundStoreChooser (shm/round_stores.h) that picks its stores from the whole operation's cost,
// of one round or of many; all_reduce one-shot and two-shot apart (different work per byte). Outside a chooser's
// Scope (a group of one, operations under RoundStoreChooser::kMinBytes, stores forced by TUNEDIST_SLOT_STORES) the
// copies are cached, or streaming when forced.
//
// Why the choice: a cached copy (memcpy) leaves the lines in our cache, where a peer on a nearby core fetches them
// fastest, but every line of a slot was read by a peer an operation or two ago, so our stores must first take it back
// from the peer's cache. Where the two vCPUs sit far apart in the coherence fabric that costs 27-36 ns a line instead
// of 7-9, and streaming stores, which write to memory without taking the line back, make the hand-off 3-5x faster;
// where they sit close, streaming is the slower (docs/performance.md#store-placement-cached-or-streaming).
//
// The round protocol (shm/rounds.h) owns one StorePolicy and opens a Scope per operation; the algorithms copy into
// their slot through the Scope and never see families, verdicts or streaming flags.
#pragma once

#include <chrono>
#include <cstddef>

#include "core/options.h"
#include "kernels/reduce.h"
#include "shm/layout.h"
#include "shm/round_stores.h"

namespace tunedist::shm {

class StorePolicy {
 public:
  enum Family {
    kOneShotAllreduce,
    kAllgather,
    kReduceScatter,
    kBroadcast,
    kTwoShotAllreduce,
    kReduce,
    kGather,
    kScatter,
    kAlltoall
  };

  // Where a Scope reads and writes the group's shared state for one operation: every rank's RankCtl (its published
  // verdicts), ours, our descriptor of the operation while it is still unpublished (null after the first publish), and
  // whether some rank's descriptor asked for a probe window (valid after the first wait).
  struct Site {
    RankCtl* ctls;
    int rank;
    int size;
    OpDesc* pendingDesc;
    const bool* groupProbeRequest;
  };

  // For the length of one operation under core::SlotStores::kAuto with peers and `bytes` (what its size class is
  // counted in) of at least RoundStoreChooser::kMinBytes: its copies into our slot, in every round, use the stores that
  // the family's chooser plans, and when the chooser times the operation, done() reports its work: the time since
  // construction outside the waits for peers, per byte. An operation that throws reports nothing.
  class Scope {
   public:
    Scope(StorePolicy& policy, Family family, size_t bytes, const Site& site);
    ~Scope() {
      policy_.streaming_ = -1;
      policy_.timingWaits_ = false;
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    // After the operation's last read of a peer's slot.
    void done();
    // Whether the chooser picks this operation's stores.
    bool active() const { return policy_.streaming_ >= 0; }

    // Copies into our own slot, which peers read next; streaming copies end with an sfence, so the caller's release
    // store (publish) orders them.
    void copyIn(void* dst, const void* src, size_t n) {
      if (streaming()) {
        kernels::copyBytes(dst, src, n);
      } else {
        kernels::copyBytesCached(dst, src, n);
      }
    }
    // copyIn(dst, src, n) plus our own output block `own` (an all_gather's; streaming stores when `streamOwn`), in one
    // pass over src (copyBytesTwice). No overlaps.
    void copyInAndOwn(void* dst, void* own, const void* src, size_t n, bool streamOwn) {
      kernels::copyBytesTwice(dst, own, src, n, streaming(), streamOwn);
    }
    // Streaming stores unless TUNEDIST_SLOT_STORES forces cached ones: for a slot that only the peers read, where the
    // caller knows streaming is the faster (core::ShmOptions::broadcastStreamBelowBytes).
    void copyInStreaming(void* dst, const void* src, size_t n) {
      if (policy_.mode_ == core::SlotStores::kCached) {
        kernels::copyBytesCached(dst, src, n);
      } else {
        kernels::copyBytes(dst, src, n);
      }
    }

   private:
    // The chooser's stores while it picks them; else the forced ones (kAuto outside a Scope: cached).
    bool streaming() const {
      return policy_.streaming_ >= 0 ? policy_.streaming_ > 0 : policy_.mode_ == core::SlotStores::kStreaming;
    }

    StorePolicy& policy_;
    const Site site_;
    // The family's chooser and the operation's class while the chooser picks the stores; chooser_ while it times.
    RoundStoreChooser* family_ = nullptr;
    int cls_ = 0;
    RoundStoreChooser* chooser_ = nullptr;
    size_t bytes_ = 0;
    std::chrono::steady_clock::time_point start_;
  };

  explicit StorePolicy(const core::ShmOptions& options);

  const RoundStoreChooser& chooser(Family family) const { return choosers_[family]; }
  // Only from the thread that runs this rank's operations, between them.
  RoundStoreChooser& chooser(Family family) { return choosers_[family]; }

  // While a Scope times its operation, the round protocol reports the time it spent waiting for peers.
  bool timingWaits() const { return timingWaits_; }
  void addWaited(std::chrono::nanoseconds waited) { waited_ += waited; }

 private:
  const core::SlotStores mode_;
  // A broadcast's classes under broadcastStreamBelowBytes start streaming (ShmOptions).
  RoundStoreChooser choosers_[kRoundFamilies];
  static_assert(kAlltoall + 1 == kRoundFamilies, "one RoundVerdict per family in RankCtl");
  // While a Scope is open: its stores (0 cached, 1 streaming; -1: mode_ decides), and while it times the
  // operation, the time spent waiting for peers.
  int streaming_ = -1;
  bool timingWaits_ = false;
  std::chrono::nanoseconds waited_{0};
};

}  // namespace tunedist::shm
