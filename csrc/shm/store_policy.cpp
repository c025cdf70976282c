#include "shm/store_policy.h"

#include <algorithm>

namespace tunedist::shm {

StorePolicy::StorePolicy(const core::ShmOptions& options) : mode_(options.slotStores) {
  choosers_[kBroadcast] = RoundStoreChooser(options.broadcastStreamBelowBytes);
}

StorePolicy::Scope::Scope(StorePolicy& policy, Family family, size_t bytes, const Site& site)
    : policy_(policy), site_(site) {
  // Under kMinBytes the chooser has nothing to time: the copies are cached (Scope::copyIn), or as forced.
  if (site.size <= 1 || policy.mode_ != core::SlotStores::kAuto || bytes < RoundStoreChooser::kMinBytes) {
    return;
  }
  RoundStoreChooser& chooser = policy.choosers_[family];
  const int cls = RoundStoreChooser::classOf(bytes);
  if (chooser.verdictDue(cls)) {
    // Every rank that closed the window with us published its medians before the step we have since waited for.
    // The slowest rank's work in each mode decides: back to back, an operation can start no faster than its
    // busiest rank ends the previous one (a broadcast's root and readers do different work).
    double cached = 0;
    double streaming = 0;
    for (int p = 0; p < site.size; ++p) {
      const RoundVerdict& v = site.ctls[p].verdicts[family][cls];
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
  if (chooser.probeWanted(cls) && site.pendingDesc != nullptr) {
    // Our descriptor of this operation carries the ask; the first publish releases it (all_to_all, which publishes its
    // sizes before it knows its class, cannot ask: it waits for its next scheduled window).
    site.pendingDesc->probeRequest = 1;
  }
  if (plan.windowClosed) {
    // Published by this operation's first step (release); read by the peers at their next operation of the class.
    RoundVerdict& mine = site.ctls[site.rank].verdicts[family][cls];
    mine.cachedNsPerByte.store(float(chooser.lastCachedNsPerByte(cls)), std::memory_order_relaxed);
    mine.streamingNsPerByte.store(float(chooser.lastStreamingNsPerByte(cls)), std::memory_order_relaxed);
    mine.window.store(chooser.windows(cls), std::memory_order_relaxed);
  }
  policy.streaming_ = plan.streaming ? 1 : 0;
  if (plan.timed) {
    chooser_ = &chooser;
    bytes_ = bytes;
    policy.timingWaits_ = true;
    policy.waited_ = std::chrono::nanoseconds(0);
    start_ = std::chrono::steady_clock::now();
  }
}

void StorePolicy::Scope::done() {
  if (family_ != nullptr && *site_.groupProbeRequest) {
    // Every rank read the same descriptors of this operation: all start the window at the class's next operation.
    family_->startWindowNext(cls_);
    family_ = nullptr;
  }
  if (chooser_ != nullptr) {
    const auto work = std::chrono::steady_clock::now() - start_ - policy_.waited_;
    chooser_->record(double(std::chrono::duration_cast<std::chrono::nanoseconds>(work).count()) / double(bytes_));
    chooser_ = nullptr;
    policy_.timingWaits_ = false;
  }
}

}  // namespace tunedist::shm
