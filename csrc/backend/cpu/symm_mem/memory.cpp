#include "backend/cpu/symm_mem/memory.h"

#include <atomic>

namespace tunedist::cpu::symm_mem {

CpuSymmetricMemory::CpuSymmetricMemory(std::shared_ptr<SymmetricRegion> region, size_t signalBytes)
    : region_(std::move(region)), signalBytes_(signalBytes), epochs_(channels(), 0) {
  TORCH_INTERNAL_ASSERT(region_->padBytes() >= padBytesFor(signalBytes_, region_->size()));
}

size_t CpuSymmetricMemory::padBytesFor(size_t signalBytes, int worldSize) {
  const size_t channels = signalBytes / sizeof(uint32_t) / size_t(worldSize);
  // The epochs start on a cache line of their own.
  const size_t signalPart = (signalBytes + 63) / 64 * 64;
  return signalPart + channels * sizeof(uint64_t);
}

void** CpuSymmetricMemory::get_buffer_ptrs_dev() {
  TORCH_CHECK(false, "tunedist: SymmetricMemory.buffer_ptrs_dev: rank ", region_->rank(),
              ": a CPU symmetric memory has no device array of pointers; use buffer_ptrs (host pointers, valid in "
              "this process)");
}

void** CpuSymmetricMemory::get_signal_pad_ptrs_dev() {
  TORCH_CHECK(false, "tunedist: SymmetricMemory.signal_pad_ptrs_dev: rank ", region_->rank(),
              ": a CPU symmetric memory has no device array of pointers; use signal_pad_ptrs (host pointers, valid "
              "in this process)");
}

uint32_t* CpuSymmetricMemory::signalWord(const char* op, int padRank, int channel, int slot) {
  const size_t words = signalBytes_ / sizeof(uint32_t);
  const size_t ws = size_t(region_->size());
  TORCH_CHECK(channel >= 0 && (size_t(channel) + 1) * ws <= words, "tunedist: ", op, ": rank ", region_->rank(),
              ": channel ", channel, " is out of range: the signal pad (", signalBytes_, " bytes, ",
              "torch.distributed._symmetric_memory.set_signal_pad_size) holds channels 0..", words / ws - 1,
              " for a group of ", ws);
  return reinterpret_cast<uint32_t*>(region_->pad(op, padRank)) + size_t(channel) * ws + size_t(slot);
}

void CpuSymmetricMemory::putSignal(const char* op, int dst, int channel, std::chrono::milliseconds timeout) {
  std::atomic_ref<uint32_t> word(*signalWord(op, dst, channel, region_->rank()));
  // Release: our writes into dst's buffer before this call are visible to dst once its wait_signal sees the 1.
  // seq_cst: pairs with the waiter's count of sleepers (SymmetricRegion::notify).
  region_->waitFor(op, dst, timeout, c10::str("rank ", dst, " to consume our previous signal on channel ", channel),
                   [&] {
                     uint32_t expected = 0;
                     return word.compare_exchange_strong(expected, 1, std::memory_order_seq_cst);
                   });
  region_->notify();
}

void CpuSymmetricMemory::waitSignal(const char* op, int src, int channel, std::chrono::milliseconds timeout) {
  std::atomic_ref<uint32_t> word(*signalWord(op, region_->rank(), channel, src));
  // Acquire: src's writes before its put_signal are visible once we see its 1.
  region_->waitFor(op, src, timeout, c10::str("a signal on channel ", channel), [&] {
    uint32_t expected = 1;
    return word.compare_exchange_strong(expected, 0, std::memory_order_seq_cst);
  });
  // A signaller may wait for this word to be 0 again (its next put_signal).
  region_->notify();
}

void CpuSymmetricMemory::put_signal(int dst_rank, int channel, size_t timeout_ms) {
  constexpr const char* kOp = "SymmetricMemory.put_signal";
  region_->checkPeer(kOp, dst_rank);
  putSignal(kOp, dst_rank, channel, region_->timeoutOr(timeout_ms));
}

void CpuSymmetricMemory::wait_signal(int src_rank, int channel, size_t timeout_ms) {
  constexpr const char* kOp = "SymmetricMemory.wait_signal";
  region_->checkPeer(kOp, src_rank);
  waitSignal(kOp, src_rank, channel, region_->timeoutOr(timeout_ms));
}

uint64_t* CpuSymmetricMemory::epochWord(const char* op, int padRank, int channel) {
  const size_t signalPart = (signalBytes_ + 63) / 64 * 64;
  return reinterpret_cast<uint64_t*>(region_->pad(op, padRank) + signalPart) + channel;
}

// 1. Bump our epoch of the channel (seq_cst: what we wrote before is visible to a peer that sees it; pairs with a
//    sleeping peer's count of sleepers) and ring the bell.
// 2. Wait until every peer's epoch of the channel has reached ours: every rank has entered this barrier, and what
//    each wrote before it is visible here. Ranks call barriers on a channel in the same order, so epochs agree.
void CpuSymmetricMemory::barrier(int channel, size_t timeout_ms) {
  constexpr const char* kOp = "SymmetricMemory.barrier";
  const int rank = region_->rank();
  const int size = region_->size();
  TORCH_CHECK(channel >= 0 && size_t(channel) < channels(), "tunedist: ", kOp, ": rank ", rank, ": channel ", channel,
              " is out of range: the signal pad (", signalBytes_,
              " bytes, torch.distributed._symmetric_memory.set_signal_pad_size) holds channels 0..", channels() - 1,
              " for a group of ", size);
  const auto timeout = region_->timeoutOr(timeout_ms);
  const uint64_t epoch = ++epochs_[size_t(channel)];
  std::atomic_ref<uint64_t>(*epochWord(kOp, rank, channel)).store(epoch, std::memory_order_seq_cst);
  region_->notify();
  for (int k = 1; k < size; ++k) {
    const int peer = (rank + k) % size;
    std::atomic_ref<uint64_t> theirs(*epochWord(kOp, peer, channel));
    region_->waitFor(kOp, peer, timeout, c10::str("barrier ", epoch, " on channel ", channel),
                     [&] { return theirs.load(std::memory_order_seq_cst) >= epoch; });
  }
}

}  // namespace tunedist::cpu::symm_mem
