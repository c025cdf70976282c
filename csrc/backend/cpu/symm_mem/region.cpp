#include "backend/cpu/symm_mem/region.h"

#include <sched.h>

#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "shm/group_segment.h"

namespace tunedist::cpu::symm_mem {

namespace {
// The title of the rendezvous operation in profiles and completion hooks.
constexpr const char* kRendezvousTitle = "tuned:symm_mem_rendezvous";
}  // namespace

// 1. Exchange the buffer (a collective operation on the group's executor, in order with its collectives): every
//    rank maps every peer's buffer, or all fail alike (a buffer outside a rank's heap, sizes that differ).
// 2. Take a zeroed signal pad from our heap (zero before any peer can see it: the exchange publishes after the
//    memset, with release) and exchange it the same way.
std::shared_ptr<SymmetricRegion> SymmetricRegion::rendezvous(const c10::intrusive_ptr<c10d::Backend>& owner,
                                                             CpuBackend& cpu, const char* op, void* ptr, size_t bytes,
                                                             size_t padBytes) {
  std::shared_ptr<SymmetricRegion> r(new SymmetricRegion());
  r->owner_ = c10::weak_intrusive_ptr<c10d::Backend>(owner);
  r->rank_ = cpu.getRank();
  r->size_ = cpu.getSize();
  r->bytes_ = bytes;
  r->padBytes_ = padBytes;
  r->timeout_ = cpu.effectiveTimeout(c10d::kUnsetTimeout);
  const shm::zero_copy::SymmetricPeers buffers = cpu.exchangeSymmetric(op, kRendezvousTitle, ptr, bytes, r->timeout_);
  r->heap_ = cpu.heap();
  r->ownPad_ = r->heap_->allocate(padBytes);
  std::memset(r->ownPad_, 0, padBytes);
  const shm::zero_copy::SymmetricPeers pads = cpu.exchangeSymmetric(op, kRendezvousTitle, r->ownPad_, padBytes,
                                                                    r->timeout_);
  r->segment_ = buffers.segment;
  r->buffers_ = buffers.bases;
  r->pads_ = pads.bases;
  return r;
}

SymmetricRegion::~SymmetricRegion() {
  if (ownPad_ != nullptr) {
    heap_->free(ownPad_);
  }
}

c10::intrusive_ptr<c10d::Backend> SymmetricRegion::lease(const char* op) const {
  auto owner = owner_.lock();
  if (!owner) {
    fail(op, "the process group of this symmetric memory was destroyed; its peers' buffers are no longer mapped");
  }
  return owner;
}

void SymmetricRegion::fail(const char* op, const std::string& message) const {
  C10_THROW_ERROR(DistBackendError, c10::str("tunedist: ", op, ": rank ", rank_, " of ", size_, ": ", message));
}

void SymmetricRegion::checkPeer(const char* op, int64_t peer) const {
  if (peer < 0 || peer >= size_) {
    fail(op, c10::str("peer rank ", peer, " is not in the group (ranks 0..", size_ - 1, ")"));
  }
}

char* SymmetricRegion::buffer(const char* op, int p) const {
  lease(op);
  checkPeer(op, p);
  return buffers_[size_t(p)];
}

uint8_t* SymmetricRegion::pad(const char* op, int p) const {
  lease(op);
  checkPeer(op, p);
  return reinterpret_cast<uint8_t*>(pads_[size_t(p)]);
}

std::vector<void*> SymmetricRegion::buffers(const char* op) const {
  lease(op);
  return std::vector<void*>(buffers_.begin(), buffers_.end());
}

std::vector<void*> SymmetricRegion::pads(const char* op) const {
  lease(op);
  return std::vector<void*>(pads_.begin(), pads_.end());
}

std::chrono::milliseconds SymmetricRegion::timeoutOr(size_t timeoutMs) const {
  return timeoutMs == 0 ? timeout_ : std::chrono::milliseconds(int64_t(timeoutMs));
}

void SymmetricRegion::yieldCore() { sched_yield(); }

std::atomic<uint32_t>& SymmetricRegion::bellWord() const { return segment_->header().bell; }

std::atomic<uint32_t>& SymmetricRegion::sleepersWord() const { return segment_->header().sleepers; }

// The group's own waits share the bell: a ring wakes them too, and they look again (as after any publish).
void SymmetricRegion::notify() const {
  shm::SegmentHeader& header = segment_->header();
  if (header.sleepers.load(std::memory_order_seq_cst) > 0) {
    header.bell.fetch_add(1, std::memory_order_seq_cst);
    core::futexWakeAll(&header.bell);
  }
}

void SymmetricRegion::checkWait(const char* op, int peer, std::chrono::steady_clock::time_point start,
                                std::chrono::milliseconds timeout, const std::string& what) {
  // Held for this check only: the wait itself touches nothing the backend owns but the mappings, which live as
  // long as the group, and a destroyed group is found here within 256 turns.
  auto owner = lease(op);
  const shm::SegmentHeader* header = segment_->sharedHeader();
  if (header != nullptr && header->abortFlag.load(std::memory_order_acquire) == shm::kAbortSet) {
    fail(op, c10::str("rank ", header->abortRank, " aborted the group while this rank waited for ", what, ": ",
                      std::string(header->abortReason, strnlen(header->abortReason, sizeof(header->abortReason)))));
  }
  if (segment_->failed()) {
    try {
      segment_->throwIfFailed();
    } catch (const std::exception& e) {
      fail(op, c10::str("while waiting for ", what, ": ", e.what()));
    }
  }
  if (peer != rank_) {
    shm::RankCtl& c = segment_->ctl(peer);
    // The life lock knows exactly: free or owner-died means the peer's process exited or left the group.
    const core::Liveness life = core::probeLifeLock(&c.life);
    const core::ProcessIdentity who{c.pid, c.pidNamespace, c.startTime};
    if (life == core::Liveness::kGone || core::processCertainlyGone(who)) {
      const std::string message = c10::str("rank ", peer, " (pid ", c.pid,
                                           ") is dead: its process has exited or left the group while rank ", rank_,
                                           " waited for ", what,
                                           " from it. The group is unusable; restart the job (torchrun "
                                           "--max-restarts) or create a new group.");
      // Fail the group as a collective that found the death would: every rank stops waiting, and nobody maps
      // this group's heap chunks again (their names go now).
      segment_->abort(c10::str("tunedist: ", op, ": rank ", rank_, " of ", size_, ": ", message),
                      core::FailureKind::kPeerDead);
      fail(op, message);
    }
  }
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  if (waited >= timeout) {
    fail(op, c10::str("timed out after ", waited.count(), " ms waiting for ", what, " from rank ", peer,
                      ", which is alive. Check that the peer makes the matching call, or pass a longer timeout_ms."));
  }
}

}  // namespace tunedist::cpu::symm_mem
